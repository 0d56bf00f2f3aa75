"""Images: content-addressed read-only layers and named manifests (the store), the Dockerfile subset, and the
Debian base image. Sandboxes mount an image's layers as overlayfs lower dirs (sandboxd); ``adx image build``
runs each step in a sandbox (``adx.sandboxd``'s image builder)."""

from __future__ import annotations

from adx.images._debian import DEBIAN_PACKAGES, TYPICAL_BUILD_SECONDS, ensure_debian_image
from adx.images._dockerfile import Instruction, Op, parse_dockerfile
from adx.images._store import (
    POOL_HOLDER_PREFIX,
    ImageManifest,
    ImageStore,
    LayerInfo,
    layer_digest,
    validate_image_name,
)

__all__ = [
    "DEBIAN_PACKAGES",
    "POOL_HOLDER_PREFIX",
    "TYPICAL_BUILD_SECONDS",
    "ImageManifest",
    "ImageStore",
    "Instruction",
    "LayerInfo",
    "Op",
    "ensure_debian_image",
    "layer_digest",
    "parse_dockerfile",
    "validate_image_name",
]
