"""A store layer as one byte stream, and back: how a layer travels from a node that has it to one that lacks it.

The stream is a GNU tar of the layer's tree (numeric owners, modes with setuid, device nodes for overlay
whiteouts, every xattr: ``trusted.overlay.opaque`` of opaque directories, ``security.capability`` of file
capabilities). The sender hashes what it sends; the receiver hashes what it got and commits the layer only when
both the sha256 and the byte count match. A layer's store digest names the step that made it, not its bytes, so
the stream's own sha256 is what proves the bytes arrived as they left.

The receiver extracts into a staging dir of the store (``layers/.tmp-pull-<pid>-*``), fsyncs what it extracted,
then renames it to the digest (``ImageStore.commit_layer``): a pull cut short at any moment leaves no layer,
only staging debris, which the next pull on this host removes when its process is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
from collections.abc import AsyncGenerator
from pathlib import Path

from adx.errors import InvalidInputError, NotFoundError, UnavailableError
from adx.images._store import ImageStore, LayerInfo

__all__ = ["CHUNK_BYTES", "LayerReceiver", "check_digest", "fsync_tree", "layer_stream", "remove_dead_pull_staging"]

log = logging.getLogger("adx.images.transfer")

#: Bytes per streamed message: large enough that per-message costs vanish, far below gRPC's 4 MiB limit.
CHUNK_BYTES = 1 << 20
_PULL_PREFIX = "pull-"
_XATTRS = ("--xattrs", "--xattrs-include=*")


_HEX = frozenset("0123456789abcdef")


def check_digest(digest: str, field: str = "digest") -> str:
    """A layer digest is 64 lowercase hex digits: anything else (``../x``) never becomes a path in the store."""
    if len(digest) != 64 or not set(digest) <= _HEX:
        raise InvalidInputError(field, f"{digest[:80]!r} is not a layer digest (64 lowercase hex digits)")
    return digest


async def layer_stream(store: ImageStore, digest: str) -> AsyncGenerator[bytes, None]:
    """The tar stream of layer ``digest``, in chunks of up to ``CHUNK_BYTES``. NotFoundError when the store lacks
    it; UnavailableError when tar fails (e.g. the layer was collected meanwhile)."""
    if not store.has_layer(check_digest(digest)):
        raise NotFoundError(f"layer {digest} is not in this node's image store", details={"layer": digest})
    proc = await asyncio.create_subprocess_exec(
        "tar",
        "--create",
        "--file=-",
        "--format=posix",
        "--numeric-owner",
        "--sort=name",
        *_XATTRS,
        "--directory",
        str(store.layer_tree(digest)),
        ".",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    errors = asyncio.ensure_future(proc.stderr.read())
    try:
        buffer = bytearray()
        while chunk := await proc.stdout.read(CHUNK_BYTES - len(buffer)):
            buffer += chunk
            if len(buffer) >= CHUNK_BYTES:
                yield bytes(buffer)
                buffer.clear()
        if buffer:
            yield bytes(buffer)
        code = await proc.wait()
        message = (await errors).decode(errors="replace").strip()[-500:]
        if code != 0:
            raise UnavailableError(f"layer {digest}: tar exited {code}: {message}", details={"layer": digest})
    finally:
        if proc.returncode is None:  # the reader went away mid-stream
            proc.kill()
            await proc.wait()
        # Read to the end: a pipe left open keeps the process transport alive past the event loop.
        with contextlib.suppress(Exception):
            await errors


def remove_dead_pull_staging(store: ImageStore) -> list[str]:
    """Remove the staging dirs of pulls whose process is gone (a pull killed mid-layer); returns their names."""
    removed: list[str] = []
    if not store.layers_dir.is_dir():
        return removed
    for entry in store.layers_dir.iterdir():
        name = entry.name
        if not name.startswith(f".tmp-{_PULL_PREFIX}"):
            continue
        pid = name.removeprefix(f".tmp-{_PULL_PREFIX}").partition("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(name)
    return removed


def fsync_tree(root: Path) -> None:
    """fsync every regular file and directory under ``root`` (and ``root``). Not syncfs: that would also flush
    whatever else is dirty on the filesystem, stalling every other writer's fsync meanwhile (a shared host)."""
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(dirpath, name)
            if not os.path.isfile(path) or os.path.islink(path):
                continue  # symlinks and device nodes live in their directory's entries, synced below
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class LayerReceiver:
    """One layer arriving: ``feed`` its chunks, then ``finish`` with what the sender declared (verified, then
    committed), or ``abort``. Nothing is in the store under the layer's digest before ``finish`` succeeds."""

    def __init__(self, store: ImageStore, info: LayerInfo) -> None:
        check_digest(info.digest, "layer.digest")
        self.store = store
        self.info = info
        self.received = 0
        self._hash = hashlib.sha256()
        self._staging: Path | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._errors: asyncio.Future[bytes] | None = None

    async def open(self) -> LayerReceiver:
        self._staging = self.store.staging(f"{_PULL_PREFIX}{os.getpid()}-")
        self._proc = await asyncio.create_subprocess_exec(
            "tar",
            "--extract",
            "--file=-",
            "--numeric-owner",
            "--same-owner",
            "--same-permissions",
            *_XATTRS,
            "--directory",
            str(self._staging / "tree"),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        assert self._proc.stderr is not None
        self._errors = asyncio.ensure_future(self._proc.stderr.read())
        return self

    async def feed(self, data: bytes) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        await asyncio.to_thread(self._hash.update, data)  # hashlib drops the GIL: off the loop
        self.received += len(data)
        try:
            self._proc.stdin.write(data)
            await self._proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise UnavailableError(
                f"layer {self.info.digest}: extraction stopped: {await self._tar_errors()}",
                details={"layer": self.info.digest},
            ) from None

    async def _tar_errors(self) -> str:
        """tar's complaints, once it ended (read to the end either way: an open pipe outlives the loop)."""
        assert self._proc is not None and self._errors is not None
        await self._proc.wait()
        return (await self._errors).decode(errors="replace").strip()[-500:]

    async def finish(self, sha256: str, size: int, source: str) -> LayerInfo:
        """Verify the stream against the sender's ``sha256`` and ``size`` (from node ``source``), then commit."""
        assert self._proc is not None and self._proc.stdin is not None and self._staging is not None
        digest = self.info.digest
        got = self._hash.hexdigest()
        if got != sha256 or self.received != size:
            await self.abort()
            raise UnavailableError(
                f"layer {digest} from node {source} is refused: it arrived as {self.received} bytes with sha256 "
                f"{got[:16]}..., the node sent {size} bytes with sha256 {sha256[:16]}...",
                details={"layer": digest, "node": source, "reason": "digest_mismatch"},
            )
        self._proc.stdin.close()
        message = await self._tar_errors()
        if self._proc.returncode != 0:
            await self.abort()
            raise UnavailableError(f"layer {digest}: extraction failed: {message}", details={"layer": digest})
        # Durable before visible: the files reach the disk before the rename names them a layer.
        await asyncio.to_thread(fsync_tree, self._staging)
        staging, self._staging = self._staging, None
        return await asyncio.to_thread(self.store.commit_layer, staging, digest, self.info.parent, self.info.step)

    async def abort(self) -> None:
        if self._proc is not None:
            if self._proc.stdin is not None:
                self._proc.stdin.close()  # else its pipe outlives the process (and the event loop)
            if self._proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.kill()
            with contextlib.suppress(Exception):
                await self._tar_errors()
        if self._staging is not None:
            await asyncio.to_thread(shutil.rmtree, self._staging, True)
            self._staging = None
