"""``adx image import``: an OCI layout and a ``docker save`` tarball become store layers that a real sandbox
mounts; OCI whiteouts (a deleted file, an opaque directory) keep their meaning in the overlay.

The test image is made here: layer 1 holds dash, cat and the C library they need (copied from this Debian host),
a config file and a directory; layer 2 deletes a file (``.wh.NAME``), replaces the directory's content
(``.wh..wh..opq``) and adds a file. Docker is not needed.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest
from sbx_helpers import DaemonFactory

from adx.errors import InvalidInputError
from adx.images import ImageStore
from adx.images._import import import_image
from adx.sandboxd import CreateRequest, ref_of

FILES = ("/usr/bin/dash", "/usr/bin/cat", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2")


def _tar(entries: list[tuple[str, bytes | None, int]]) -> bytes:
    """(path, content or None for a directory, mode)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, mode in entries:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _layers() -> list[bytes]:
    first: list[tuple[str, bytes | None, int]] = [(d, None, 0o755) for d in ("usr", "usr/bin", "lib", "lib64", "etc")]
    first += [("lib/x86_64-linux-gnu", None, 0o755), ("etc/conf.d", None, 0o755), ("bin", None, 0o755)]
    first += [(p.lstrip("/"), Path(p).read_bytes(), 0o755) for p in FILES]
    first += [
        ("bin/sh", Path("/usr/bin/dash").read_bytes(), 0o755),
        ("bin/cat", Path("/usr/bin/cat").read_bytes(), 0o755),
    ]
    first += [("etc/gone", b"deleted later\n", 0o644), ("etc/conf.d/old", b"old\n", 0o644)]
    second = [
        ("etc/.wh.gone", b"", 0o644),
        ("etc/conf.d", None, 0o755),
        ("etc/conf.d/.wh..wh..opq", b"", 0o644),
        ("etc/conf.d/new", b"new\n", 0o644),
        ("etc/msg", b"hello from layer 2\n", 0o644),
    ]
    return [_tar(first), gzip.compress(_tar(second))]


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


CONFIG = {"config": {"Env": ["PATH=/bin:/usr/bin", "GREETING=hi"], "WorkingDir": "/etc", "User": "0:0"}}


def _oci_layout(root: Path) -> Path:
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> str:
        digest = _digest(data)
        (blobs / digest.split(":")[1]).write_bytes(data)
        return digest

    layers = [
        {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": put(d), "size": len(d)} for d in _layers()
    ]
    config = put(json.dumps(CONFIG).encode())
    manifest = put(json.dumps({"schemaVersion": 2, "config": {"digest": config}, "layers": layers}).encode())
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{"digest": manifest}]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return root


def _docker_save(path: Path) -> Path:
    with tarfile.open(path, "w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        names = []
        for i, data in enumerate(_layers()):
            names.append(f"l{i}/layer.tar")
            add(names[-1], data)
        add("config.json", json.dumps(CONFIG).encode())
        add("manifest.json", json.dumps([{"Config": "config.json", "RepoTags": ["x:1"], "Layers": names}]).encode())
    return path


@pytest.mark.parametrize("kind", ["oci", "docker-save"])
async def test_imported_image_runs_with_whiteouts_applied(sandboxd: DaemonFactory, tmp_path: Path, kind: str) -> None:
    images = tmp_path / "images"
    store = ImageStore(images / "store").ensure()
    source = _oci_layout(tmp_path / "oci") if kind == "oci" else _docker_save(tmp_path / "saved.tar")
    manifest = import_image(store, source, "imported")
    assert len(manifest.layers) == 2 and manifest.workdir == "/etc" and manifest.user == "root"
    assert manifest.env == {"PATH": "/bin:/usr/bin", "GREETING": "hi"}
    again = import_image(store, source, "imported-again")
    assert again.layers == manifest.layers  # content-addressed: stored once
    d = sandboxd("d1", images_dir=str(images))
    async with d.client() as c:
        script = "cat /etc/msg /etc/conf.d/new; echo $GREETING; cat /etc/gone /etc/conf.d/old 2>&1; echo end"
        created = await c.create(
            CreateRequest(request_id=uuid.uuid4().hex, image="imported", argv=["/bin/sh", "-c", script])
        )
        ref = ref_of(created)
        waited = await c.wait(ref, timeout_seconds=30)
        out = (await c.output(ref)).output
        assert waited.sandbox.exit is not None and waited.sandbox.exit.exit_code == 0, out
        lines = out.splitlines()
        assert lines[:3] == ["hello from layer 2", "new", "hi"], out
        assert "No such file" in lines[3] and "No such file" in lines[4] and lines[5] == "end", out
        await c.delete(ref)


def test_a_layer_escaping_through_a_symlink_is_refused(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        link = tarfile.TarInfo("etc")
        link.type, link.linkname = tarfile.SYMTYPE, str(tmp_path / "host")
        tar.addfile(link)
        evil = tarfile.TarInfo("etc/passwd")
        evil.size = 1
        tar.addfile(evil, io.BytesIO(b"x"))
    (tmp_path / "host").mkdir()
    layer = buf.getvalue()
    save = tmp_path / "evil.tar"
    with tarfile.open(save, "w") as tar:
        for name, data in (
            ("l.tar", layer),
            ("c.json", b"{}"),
            ("manifest.json", b'[{"Config":"c.json","Layers":["l.tar"]}]'),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(InvalidInputError):
        import_image(ImageStore(tmp_path / "store").ensure(), save, "evil")
    assert not (tmp_path / "host" / "passwd").exists()


def test_adx_image_import_command(tmp_path: Path) -> None:
    config = tmp_path / "sandboxd.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\nimages_dir = "{tmp_path / "images"}"\n')
    saved = _docker_save(tmp_path / "saved.tar")
    done = subprocess.run(
        [sys.executable, "-m", "adx", "image", "import", str(saved), "cli-imported", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "image cli-imported: 2 layers" in done.stdout, done.stdout + done.stderr
    assert ImageStore(tmp_path / "images" / "store").get("cli-imported").workdir == "/etc"
