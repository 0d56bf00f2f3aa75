"""Where the SDK finds the API: arguments, then ``ADX_API_URL``/``ADX_API_KEY``, then the credentials file.

The credentials file is what ``adx up`` writes: ``$XDG_CONFIG_HOME/adx/credentials.json`` (default
``~/.config/adx/credentials.json``), mode 0600, ``{"api_url": "http://127.0.0.1:8080", "api_key": "..."}``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from adx.errors import InvalidInputError

ENV_URL = "ADX_API_URL"
ENV_KEY = "ADX_API_KEY"


@dataclass(frozen=True)
class Settings:
    api_url: str
    api_key: str


def credentials_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "adx" / "credentials.json"


def read_credentials(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InvalidInputError(str(path), f"is not a readable credentials file: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInputError(str(path), 'must hold {"api_url": ..., "api_key": ...}')
    return {k: v for k, v in data.items() if k in ("api_url", "api_key") and isinstance(v, str)}


def write_credentials(api_url: str, api_key: str, path: Path | None = None) -> Path:
    """Write the credentials file atomically with mode 0600 (what ``adx up`` calls)."""
    target = path or credentials_path()
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".credentials.")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump({"api_url": api_url, "api_key": api_key}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def resolve(api_url: str | None, api_key: str | None, environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    url = api_url or env.get(ENV_URL) or None
    key = api_key or env.get(ENV_KEY) or None
    if url is None or key is None:
        stored = read_credentials(credentials_path(env))
        url = url or stored.get("api_url")
        key = key or stored.get("api_key")
    hint = f"pass it, set {{}}, or run `adx up` (it writes {credentials_path(env)})"
    if not url:
        raise InvalidInputError("api_url", "not configured: " + hint.format(ENV_URL))
    if not key:
        raise InvalidInputError("api_key", "not configured: " + hint.format(ENV_KEY))
    if not url.startswith(("http://", "https://")):
        raise InvalidInputError("api_url", f"must start with http:// or https://, got {url!r}")
    return Settings(url.rstrip("/"), key)
