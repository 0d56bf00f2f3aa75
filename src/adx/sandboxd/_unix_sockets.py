"""The Unix sockets sandboxd listens on for its sandboxes (execd's, the control hub's): bound without a race,
and who is on the other end."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from typing import Any

__all__ = ["bind_unix", "listen_unix", "peer_credentials"]


def peer_credentials(sock: Any) -> tuple[int, int, int]:
    """(pid, uid, gid) of the peer of a connected Unix socket, as recorded by the kernel at connect().

    ``sock`` is a socket or asyncio's TransportSocket wrapper (both have ``getsockopt``).
    """
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def bind_unix(path: str, mode: int = 0o600) -> socket.socket:
    """A bound (not yet listening) Unix stream socket at ``path`` (replacing a stale file), CLOEXEC.

    The parent must be a real directory that only the host can write to. The mode is set on the socket before
    ``bind`` (Linux applies it to the new file): nothing is changed by path afterwards. Binding through an
    ``O_PATH`` descriptor of the directory lifts ``sun_path``'s 108-byte limit.
    """
    parent, name = os.path.split(path)
    dir_fd = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        os.fchmod(sock.fileno(), mode)
        sock.bind(f"/proc/self/fd/{dir_fd}/{name}")
    except BaseException:
        sock.close()
        raise
    finally:
        os.close(dir_fd)
    return sock


def listen_unix(path: str, mode: int = 0o600, backlog: int = 512) -> int:
    """A listening Unix stream socket at ``path`` (``bind_unix``); returns its descriptor."""
    with bind_unix(path, mode) as sock:  # closed if listen fails; a detached socket's close is a no-op
        sock.listen(backlog)
        return sock.detach()
