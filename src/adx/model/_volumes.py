"""Named volumes: a tenant's persistent directory, mounted into Environments at a path they choose.

Shared by the API server (which creates, lists and serves a volume's files), the node (which turns a mount
into the host directory sandboxd binds) and the model's spec validation. No I/O here: the on-disk store is
``adx.volumes``.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from pydantic import Field, field_validator

from adx.model._base import ApiModel

#: A volume's ID kind (``vol-<26 base32 chars>``).
VOLUME = "vol"
#: A volume name: also its directory's name, so no dot first (the store's own entries start with one) and no '/'.
VOLUME_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
#: Mount points a volume may not cover: the root, and the kernel's and ADX's own trees.
FORBIDDEN_MOUNTS = ("/", "/proc", "/sys", "/dev", "/run/adx")
MAX_VOLUME_MOUNTS = 16


def check_volume_name(value: str) -> str:
    if not VOLUME_NAME.match(value):
        raise ValueError("must be 1-63 letters, digits, '_' or '-', starting with a letter or digit")
    return value


class VolumeMount(ApiModel):
    """One volume of the Environment's tenant, mounted read-write at ``path``."""

    name: str = Field(pattern=VOLUME_NAME.pattern, description="the tenant's volume (its name)")
    path: str = Field(description="absolute mount point inside the Environment")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_volume_name(value)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/") or "\x00" in value or len(value) > 1024:
            raise ValueError("must be an absolute path (at most 1024 characters, no NUL)")
        norm = posixpath.normpath(value)
        if norm.startswith("//"):
            norm = "/" + norm.lstrip("/")
        for forbidden in FORBIDDEN_MOUNTS:
            if norm == forbidden or (forbidden != "/" and norm.startswith(forbidden + "/")):
                raise ValueError(f"must not be {forbidden} or under it" if forbidden != "/" else "must not be /")
        return norm


class Volume(ApiModel):
    """A tenant's named volume, as the store records it (``volume.json`` beside its data)."""

    id: str
    tenant: str
    name: str
    created_at: float


def volume_data_dir(root: Path, tenant: str, name: str) -> Path:
    """The host directory holding volume ``name`` of ``tenant`` under a volume root (the one layout shared by the
    store, which makes it, and the node, which hands it to sandboxd to mount)."""
    return root / tenant_dir_name(tenant) / check_volume_name(name) / "data"


def tenant_dir_name(tenant: str) -> str:
    """A tenant's directory under the volume root: the name itself when it is a safe path component, else
    ``~`` and its UTF-8 in hex (never a dot first, never a '/')."""
    if re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}", tenant):
        return tenant
    return "~" + tenant.encode().hex()


class VolumeRequest(ApiModel):
    """``POST /v1/volumes``: a new named volume of the caller's tenant."""

    name: str = Field(
        pattern=VOLUME_NAME.pattern,
        description="unique among the tenant's volumes; 1-63 letters, digits, '_' or '-', starting with a letter or "
        "digit",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_volume_name(value)


class VolumeList(ApiModel):
    volumes: list[Volume]
