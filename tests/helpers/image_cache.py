"""The Debian image the tests share: built once into a store that outlives the test session
(``ADX_TEST_IMAGE_CACHE``, default ``/var/tmp/adx-test-images``). Its layer is content-addressed, so a cached
one is the very same tree a cold build makes (bench/bench_images.py measures the cold build)."""

from __future__ import annotations

import os
from pathlib import Path

from adx.images import ImageStore, ensure_debian_image

CACHE = Path(os.environ.get("ADX_TEST_IMAGE_CACHE", "/var/tmp/adx-test-images"))


def cached_debian_store() -> ImageStore:
    """The cache's store, holding ``debian`` (~2-3 min the first time on this machine, then found)."""
    store = ImageStore(CACHE / "store").ensure()
    ensure_debian_image(store, progress=print)
    return store
