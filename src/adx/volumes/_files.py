"""A volume's files, as E2B's volume content API reaches them: every path is resolved inside the volume's data
directory by the kernel (``openat2`` with ``RESOLVE_IN_ROOT``), so a symlink a sandbox left in the volume (to
``/`` or ``../..``) resolves inside the volume too, never to the host's files, with no check-then-use race.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import posixpath
import shutil
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from adx.errors import ConflictError, InvalidInputError, NotFoundError
from adx.volumes._store import DATA_GID, DATA_UID

__all__ = ["EntryStat", "VolumeFiles"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_NR_OPENAT2 = 437  # the same number on every architecture (new syscalls share one table)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
CHUNK = 1 << 20
MAX_DEPTH = 32


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _openat2(root_fd: int, path: str, flags: int, mode: int = 0) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
    while True:
        fd = _libc.syscall(_NR_OPENAT2, ctypes.c_int(root_fd), os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err not in (errno.EINTR, errno.EAGAIN):  # EAGAIN: a concurrent rename; the kernel asks for a retry
            raise OSError(err, os.strerror(err), path)


@dataclass(frozen=True)
class EntryStat:
    name: str
    type: str  # directory, file, symlink, unknown (E2B's VolumeEntryStatType)
    path: str
    size: int
    mode: int
    uid: int
    gid: int
    atime: float
    mtime: float
    ctime: float
    target: str | None = None


def _type(st: os.stat_result) -> str:
    if stat.S_ISDIR(st.st_mode):
        return "directory"
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    return "unknown"


def normalize(path: str) -> str:
    """The volume-absolute form of ``path`` (``/`` is the volume's top); 400 naming ``path`` when it is not one."""
    if not isinstance(path, str) or "\x00" in path or len(path) > 4096:
        raise InvalidInputError("path", "must be a path of at most 4096 characters without NUL")
    norm = posixpath.normpath("/" + path)
    return "/" + norm.lstrip("/")


class VolumeFiles:
    """Operations on one volume's data directory. Synchronous: run them in a thread from an event loop."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    @contextlib.contextmanager
    def _root(self) -> Iterator[int]:
        try:
            fd = os.open(self.data_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFoundError("the volume no longer exists") from None
        try:
            yield fd
        finally:
            os.close(fd)

    def _open(self, path: str, flags: int) -> int:
        """A descriptor of ``path`` (normalized), resolved inside the volume (openat2); a missing one is a 404."""
        with self._root() as root:
            try:
                return _openat2(root, path, flags)
            except OSError as exc:
                raise _not_found(exc, path) from None

    @contextlib.contextmanager
    def _opened(self, path: str, flags: int) -> Iterator[int]:
        """:meth:`_open`, closed on leaving."""
        fd = self._open(path, flags)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _parent(self, path: str) -> Iterator[tuple[int, str]]:
        """(descriptor of the parent directory, final name) of ``path`` (not ``/``)."""
        norm = normalize(path)
        if norm == "/":
            raise InvalidInputError("path", "must name an entry inside the volume, not its top")
        parent, name = posixpath.split(norm)
        with self._opened(parent, os.O_PATH | os.O_DIRECTORY) as fd:
            yield fd, name

    def _stat_at(self, dir_fd: int, name: str, path: str) -> EntryStat:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        target = None
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=dir_fd)
        return EntryStat(
            name=posixpath.basename(path) or "/",
            type=_type(st),
            path=path,
            size=st.st_size,
            mode=stat.S_IMODE(st.st_mode),
            uid=st.st_uid,
            gid=st.st_gid,
            atime=st.st_atime,
            mtime=st.st_mtime,
            ctime=st.st_ctime,
            target=target,
        )

    def stat(self, path: str) -> EntryStat:
        norm = normalize(path)
        if norm == "/":
            with self._root() as root:
                return self._stat_at(root, ".", "/")
        with self._parent(norm) as (fd, name):
            try:
                return self._stat_at(fd, name, norm)
            except OSError as exc:
                raise _not_found(exc, norm) from None

    def list_dir(self, path: str, depth: int = 1) -> list[EntryStat]:
        if depth < 1 or depth > MAX_DEPTH:
            raise InvalidInputError("depth", f"must be 1 to {MAX_DEPTH}")
        norm = normalize(path)
        with self._opened(norm, os.O_RDONLY | os.O_DIRECTORY) as fd:
            out: list[EntryStat] = []
            self._walk(fd, norm, depth, out)
            return out

    def _walk(self, fd: int, path: str, depth: int, out: list[EntryStat]) -> None:
        for name in sorted(os.listdir(fd)):
            child = posixpath.join(path, name)
            try:
                entry = self._stat_at(fd, name, child)
            except FileNotFoundError:
                continue  # removed meanwhile
            out.append(entry)
            if entry.type == "directory" and depth > 1:
                try:
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError:
                    continue
                try:
                    self._walk(sub, child, depth - 1, out)
                finally:
                    os.close(sub)

    def make_dir(self, path: str, uid: int | None, gid: int | None, mode: int | None, parents: bool) -> EntryStat:
        norm = normalize(path)
        if parents:
            self._make_parents(posixpath.dirname(norm), uid, gid, mode)
        with self._parent(norm) as (fd, name):
            try:
                os.mkdir(name, 0o755 if mode is None else mode & 0o7777, dir_fd=fd)
            except FileExistsError:
                raise ConflictError(f"path: {norm} exists", details={"field": "path"}) from None
            self._own(fd, name, uid, gid, mode)
            return self._stat_at(fd, name, norm)

    def _make_parents(self, path: str, uid: int | None, gid: int | None, mode: int | None) -> None:
        parts = [p for p in path.split("/") if p]
        for i in range(len(parts)):
            sub = "/" + "/".join(parts[: i + 1])
            with self._parent(sub) as (fd, name), contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755 if mode is None else mode & 0o7777, dir_fd=fd)
                self._own(fd, name, uid, gid, mode)

    @staticmethod
    def _own(fd: int, name: str, uid: int | None, gid: int | None, mode: int | None) -> None:
        os.chown(
            name,
            DATA_UID if uid is None else uid,
            DATA_GID if gid is None else gid,
            dir_fd=fd,
            follow_symlinks=False,
        )
        if mode is not None:
            os.chmod(name, mode & 0o7777, dir_fd=fd)  # after chown, which clears setuid/setgid bits

    def read(self, path: str) -> Iterator[bytes]:
        """The file's bytes in chunks (opened before the first chunk: a missing file raises here)."""
        norm = normalize(path)
        fd = self._open(norm, os.O_RDONLY)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.close(fd)
            raise InvalidInputError("path", f"{norm} is a directory")
        return _chunks(fd)

    def write(
        self, path: str, chunks: Iterator[bytes], uid: int | None, gid: int | None, mode: int | None, parents: bool
    ) -> EntryStat:
        """Replace (or create) the file atomically: a temporary file beside it, renamed over it when complete."""
        norm = normalize(path)
        if parents:
            self._make_parents(posixpath.dirname(norm), None, None, None)
        with self._parent(norm) as (fd, name):
            tmp = f".{name[:100]}.{uuid.uuid4().hex}.tmp"
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644, dir_fd=fd)
            try:
                try:
                    for chunk in chunks:
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(out, view) :]
                    os.fsync(out)
                finally:
                    os.close(out)
                self._own(fd, tmp, uid, gid, 0o644 if mode is None else mode)
                os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except IsADirectoryError:
                os.unlink(tmp, dir_fd=fd)
                raise InvalidInputError("path", f"{norm} is a directory") from None
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=fd)
                raise
            return self._stat_at(fd, name, norm)

    def set_metadata(self, path: str, uid: int | None, gid: int | None, mode: int | None) -> EntryStat:
        norm = normalize(path)
        with self._parent(norm) as (fd, name):
            try:
                if uid is not None or gid is not None:
                    os.chown(
                        name, -1 if uid is None else uid, -1 if gid is None else gid, dir_fd=fd, follow_symlinks=False
                    )
                if mode is not None:
                    os.chmod(name, mode & 0o7777, dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                raise _not_found(exc, norm) from None
            return self._stat_at(fd, name, norm)

    def remove(self, path: str) -> None:
        norm = normalize(path)
        with self._parent(norm) as (fd, name):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                raise _not_found(exc, norm) from None
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)


def _chunks(fd: int) -> Iterator[bytes]:
    try:
        while chunk := os.read(fd, CHUNK):
            yield chunk
    finally:
        os.close(fd)


def _not_found(exc: OSError, path: str) -> Exception:
    """A missing entry (or a file where a directory was needed) as 404; anything else as it is."""
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return NotFoundError(f"path {path} not found", details={"path": path})
    return exc
