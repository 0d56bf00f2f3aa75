"""Running an nftables script: in process through libnftables (the library ``nft`` itself is built on, in the
same Debian package), or by ``nft -f -`` where the library cannot be loaded.

Every veth create applies its sandbox's chain (one transaction) on its path: ``nft -f`` is a fork+exec of a
binary that parses its config and builds its rule cache from scratch, 3-9 ms on this machine and more under
load; a call on one long-lived library context costs ~0.4 ms (docs/performance.md, "sandboxd create").
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import threading

from adx.errors import UnavailableError

__all__ = ["Nft"]

_LIBRARY = "libnftables.so.1"


class _Library:
    """One libnftables context, used by one thread at a time (a context is not thread-safe; the calls come
    from the daemon's worker threads). Kept for the daemon's life: a fresh context per call was measured at
    ~13 ms (it reads its configuration and rebuilds its cache), a reused one at ~0.4 ms."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(_LIBRARY)
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        ctx = lib.nft_ctx_new(0)  # NFT_CTX_DEFAULT
        if not ctx:
            raise OSError("nft_ctx_new failed")
        # Buffered: messages come back to us instead of going to this daemon's stdout and stderr.
        if lib.nft_ctx_buffer_output(ctx) != 0 or lib.nft_ctx_buffer_error(ctx) != 0:
            raise OSError("libnftables: cannot buffer its output")
        self._lib, self._ctx = lib, ctx
        self._lock = threading.Lock()

    def run(self, script: str) -> str | None:
        """None on success, else libnftables' error text."""
        with self._lock:
            rc = self._lib.nft_run_cmd_from_buffer(self._ctx, script.encode())
            error = self._lib.nft_ctx_get_error_buffer(self._ctx) or b""  # read: the buffer starts over
        return None if rc == 0 else error.decode(errors="replace").strip() or f"status {rc}"


class Nft:
    """``available``: whether nftables is installed at all (the ``nft`` binary or its library)."""

    def __init__(self) -> None:
        self.binary = shutil.which("nft")
        try:
            self._library: _Library | None = _Library()
        except (OSError, AttributeError):  # not installed, or a library without these symbols
            self._library = None

    @property
    def available(self) -> bool:
        return self._library is not None or self.binary is not None

    @property
    def in_process(self) -> bool:
        return self._library is not None

    def run(self, script: str) -> None:
        """Apply ``script`` as one transaction (blocking: from a worker thread). UnavailableError when nft
        refused it or is not installed."""
        if self._library is not None:
            error = self._library.run(script)
        elif self.binary is not None:
            done = subprocess.run([self.binary, "-f", "-"], input=script.encode(), capture_output=True, check=False)
            error = done.stderr.decode(errors="replace").strip() if done.returncode != 0 else None
        else:
            raise UnavailableError("nft (Debian's nftables package) is not installed: network policy unavailable")
        if error is not None:
            raise UnavailableError(f"nft failed: {error}")
