"""File operations inside the sandbox: streamed read, atomic streamed write, list, stat, remove, mkdir, rename.

``?user=NAME`` acts for that account (E2B's ``user`` is created on first use, :mod:`adx.execd._accounts`):
a relative path is in its home, and the files and directories a write, mkdir or rename creates are its own.
Entries report their owner and group (names and ids).

Memory stays bounded by one chunk per transfer whatever the file size: reads go file -> socket chunk by
chunk with ``drain()`` backpressure, writes go socket -> temp file chunk by chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat as stat_mod
import time
from typing import TypedDict

from adx.execd._accounts import Identity, Names, under_home
from adx.execd._atomic import create_temp, replacing
from adx.execd._http import CHUNK, HttpError, Request, Response, account, invalid

__all__ = ["FileDescription", "describe", "handle_files"]


def _who(req: Request) -> Identity | None:
    user = req.query.get("user")
    return None if user is None else account(user)


def _path(req: Request, who: Identity | None, name: str = "path") -> str:
    path = req.query.get(name)
    if not path:
        raise invalid(name, "required query parameter")
    if "\x00" in path:
        raise invalid(name, "must not contain NUL")
    if who is not None:
        path = under_home(path, who)
    elif not path.startswith("/"):
        raise invalid(name, f"must be absolute (or relative to the home of a ?user=), got {path!r}")
    return os.path.normpath(path)


def _make_dirs(path: str, who: Identity | None) -> None:
    """``mkdir -p path``; the directories it creates belong to ``who`` (their parents keep their owners)."""
    missing: list[str] = []
    probe = path
    while probe not in ("/", "") and not os.path.lexists(probe):
        missing.append(probe)
        probe = os.path.dirname(probe)
    os.makedirs(path, exist_ok=True)
    if who is not None:
        for made in missing:
            os.chown(made, who.uid, who.gid)


def _flag(req: Request, name: str) -> bool:
    raw = req.query.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise invalid(name, f"must be true or false, got {raw!r}")
    return raw in ("true", "1")


def _os_error(exc: OSError, path: str) -> HttpError:
    if exc.errno == errno.ENOENT:
        return HttpError(404, "not_found", f"{path}: no such file or directory", {"field": "path"})
    if exc.errno in (errno.EISDIR, errno.ENOTDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ELOOP):
        return HttpError(409, "conflict", f"{path}: {exc.strerror}", {"field": "path"})
    if exc.errno == errno.ENAMETOOLONG:  # the request's path, not the sandbox, is at fault
        return HttpError(400, "invalid_input", f"{path}: {exc.strerror}", {"field": "path", "reason": exc.strerror})
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return HttpError(403, "permission_denied", f"{path}: {exc.strerror}", {"field": "path"})
    return HttpError(500, "io_error", f"{path}: {exc.strerror}", {"field": "path"})


def _kind(mode: int) -> str:
    if stat_mod.S_ISREG(mode):
        return "file"
    if stat_mod.S_ISDIR(mode):
        return "directory"
    if stat_mod.S_ISLNK(mode):
        return "symlink"
    return "other"


class FileDescription(TypedDict, total=False):
    """A stat or list entry (``adx.model.FileEntry`` on the API's side)."""

    name: str
    type: str  # file, directory, symlink, other
    size: int
    mode: int  # permission bits
    mtime: float
    uid: int
    gid: int
    owner: str
    group: str
    xattrs: dict[str, str]  # user.* attributes
    target: str  # a symlink's resolved absolute path
    targetType: str  # what is there (absent when the link dangles)


def describe(name: str, st: os.stat_result, names: Names, path: str | None = None) -> FileDescription:
    """The entry itself (never followed); a symlink also names where it resolves (``target``, absolute) and
    what is there (``targetType``, absent when the link dangles), given its ``path``."""
    described: FileDescription = {
        "name": name,
        "type": _kind(st.st_mode),
        "size": st.st_size,
        "mode": stat_mod.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
        "uid": st.st_uid,
        "gid": st.st_gid,
        "owner": names.user(st.st_uid),
        "group": names.group(st.st_gid),
    }
    if path is not None and (xattrs := _user_xattrs(path)):
        described["xattrs"] = xattrs
    if path is not None and stat_mod.S_ISLNK(st.st_mode):
        described["target"] = os.path.realpath(path)
        with contextlib.suppress(OSError):
            described["targetType"] = _kind(os.stat(path).st_mode)
    return described


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(seconds: float) -> str:
    """RFC 9110's IMF-fixdate (``Sun, 06 Nov 1994 08:49:37 GMT``): ``email.utils`` would cost execd its imports."""
    t = time.gmtime(seconds)
    clock = f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
    return f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year:04d} {clock} GMT"


async def _read(req: Request, resp: Response, path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise _os_error(exc, path) from None
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            raise invalid("path", f"{path} is not a regular file")
        # The modification time, as HTTP says it (whole seconds): conditional requests are answered by it (E2B).
        extra = {"Last-Modified": http_date(st.st_mtime)} if int(st.st_mtime) > 0 else {}
        if st.st_size == 0:
            # Size 0 may still have content (/proc, /sys report 0): stream to EOF, chunked, instead.
            await resp.start(200, "application/octet-stream", length=None, extra=extra)
            while data := os.read(fd, CHUNK):
                await resp.write(data)
            await resp.end()
            return
        await resp.start(200, "application/octet-stream", length=st.st_size, extra=extra)
        remaining = st.st_size
        # Exactly the size announced in Content-Length; a file growing meanwhile is cut at that size.
        while remaining > 0:
            data = os.read(fd, min(CHUNK, remaining))
            if not data:
                break  # truncated meanwhile: the short body tells the client
            remaining -= len(data)
            await resp.write(data)
        if remaining == 0:
            await resp.end()
    finally:
        os.close(fd)


def _is_dir(path: str) -> bool:
    # A directory and not a symlink to one. Local metadata calls take microseconds: no thread hop.
    return os.path.isdir(path) and not os.path.islink(path)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: Extended attributes a write may set (``?xattr.user.NAME=VALUE``): the ``user.`` namespace only.
XATTR_PREFIX = "xattr."


def _user_xattrs(path: str) -> dict[str, str]:
    """The entry's ``user.*`` extended attributes (not followed; none where the filesystem has none)."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for name in os.listxattr(path, follow_symlinks=False):
            if name.startswith("user."):
                with contextlib.suppress(OSError):
                    found[name] = os.getxattr(path, name, follow_symlinks=False).decode("utf-8", "replace")
    return found


def _requested_xattrs(req: Request) -> dict[str, bytes]:
    wanted: dict[str, bytes] = {}
    for key, value in req.query.items():
        if key.startswith(XATTR_PREFIX):
            name = key.removeprefix(XATTR_PREFIX)
            if not name.startswith("user.") or len(name) > 255:
                raise invalid(key, "only user.* extended attributes (up to 255 characters) can be set")
            wanted[name] = value.encode()
    return wanted


async def _write(req: Request, resp: Response, path: str, who: Identity | None) -> None:
    """Write temp file next to ``path`` -> fsync -> rename -> fsync dir: readers see old or new, never a mix.

    ``?durable=false`` skips the fsyncs (still atomic: temp file and rename) for files rewritten at every start
    anyway, as the E2B API's ``/run/e2b`` files (envd's ``os.WriteFile`` does not sync either)."""
    durable = _flag(req, "durable") if "durable" in req.query else True
    raw_mode = req.query.get("mode", "644")
    try:
        mode = int(raw_mode, 8)
        if not 0 <= mode <= 0o7777:
            raise ValueError
    except ValueError:
        raise invalid("mode", f"must be an octal permission like 644, got {raw_mode!r}") from None
    parent = os.path.dirname(path) or "/"
    if _flag(req, "mkdirs"):
        try:
            _make_dirs(parent, who)
        except OSError as exc:
            raise _os_error(exc, parent) from None
    if _is_dir(path):
        raise HttpError(409, "conflict", f"{path} is a directory", {"field": "path"})
    xattrs = _requested_xattrs(req)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.execd-tmp.{os.urandom(4).hex()}")
    try:
        fd = create_temp(tmp, mode)
    except OSError as exc:
        raise _os_error(exc, parent) from None
    size = 0
    with replacing(path, tmp, fd):
        while chunk := await req.body.read():
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
            size += len(chunk)
        if who is not None:  # before the mode: chown clears setuid/setgid bits
            os.fchown(fd, who.uid, who.gid)
        os.fchmod(fd, mode)  # the umask must not narrow the requested mode
        for name, value in xattrs.items():  # on the temp file: the file appears with them, or not at all
            try:
                os.setxattr(fd, name, value)
            except OSError as exc:
                raise HttpError(400, "invalid_input", f"{path}: cannot set {name}: {exc.strerror}") from None
        # fsync of a large file can take long: off the event loop so other requests keep flowing.
        if durable:
            await asyncio.to_thread(os.fsync, fd)
    if durable:
        await asyncio.to_thread(_fsync_dir, parent)
    await resp.send_json(201, {"path": path, "size": size})


def _remove_tree(path: str) -> None:
    import shutil  # only recursive removal needs it; not paid at start-up

    shutil.rmtree(path)


async def _rename(req: Request, resp: Response, path: str, who: Identity | None) -> None:
    """``rename(2)`` of ``path`` to ``?to=`` (replacing a file there, as envd's Move); missing parents of the
    destination are made (``who``'s)."""
    target = _path(req, who, "to")
    try:
        os.lstat(path)
    except OSError as exc:
        raise _os_error(exc, path) from None
    try:
        _make_dirs(os.path.dirname(target), who)
        os.rename(path, target)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            reason = f"{path} -> {target}: not on the same filesystem"
            raise HttpError(409, "conflict", reason, {"field": "to"}) from None
        raise _os_error(exc, target) from None
    await resp.send_json(200, {"path": target})


async def handle_files(req: Request, resp: Response, action: str) -> None:
    who = _who(req)
    path = _path(req, who)
    if action == "content":
        if req.method == "GET":
            await _read(req, resp, path)
        elif req.method == "PUT":
            await _write(req, resp, path, who)
        elif req.method == "DELETE":
            recursive = _flag(req, "recursive")
            try:
                if _is_dir(path):
                    if recursive:
                        await asyncio.to_thread(_remove_tree, path)
                    else:
                        os.rmdir(path)
                else:
                    os.unlink(path)
            except OSError as exc:
                raise _os_error(exc, path) from None
            await resp.send(204)
        else:
            raise HttpError(405, "method_not_allowed", f"{req.method} is not allowed on /v1/files")
    elif action == "stat":
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise _os_error(exc, path) from None
        await resp.send_json(200, {"path": path, **describe(os.path.basename(path), st, Names(), path)})
    elif action == "list":
        names = Names()
        try:
            entries = []
            with os.scandir(path) as it:
                for entry in it:
                    with contextlib.suppress(FileNotFoundError):  # removed while listing
                        st = entry.stat(follow_symlinks=False)
                        entries.append(describe(entry.name, st, names, entry.path))
        except OSError as exc:
            raise _os_error(exc, path) from None
        entries.sort(key=lambda e: e["name"])
        await resp.send_json(200, {"path": path, "entries": entries})
    elif action == "mkdir":
        try:
            if _flag(req, "parents"):
                _make_dirs(path, who)
            else:
                os.mkdir(path)
                if who is not None:
                    os.chown(path, who.uid, who.gid)
        except OSError as exc:
            raise _os_error(exc, path) from None
        await resp.send_json(201, {"path": path})
    elif action == "rename":
        await _rename(req, resp, path, who)
