"""Inits cloned ahead of time by an idle zygote, before any spec exists, and the hand-over of a spec to one.

The clone, private mount propagation, ``lo`` up and the bounding set are the same for every sandbox: done
while the zygote waits, a create no longer waits for them.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass

from adx.sandboxd import _confinement as confine
from adx.sandboxd import _linux as lx
from adx.sandboxd import _netif as netif
from adx.sandboxd._in_namespace import in_namespace_setup
from adx.sandboxd._mounts import mounts_pair
from adx.sandboxd._output import open_write_ends
from adx.sandboxd._spawn_spec import SpawnSpec, read_to_eof

__all__ = ["PreparedInit", "hand_to_prepared", "prepare_init"]


@dataclass
class PreparedInit:
    """A sandbox's init cloned by an idle zygote before any spec (:func:`prepare_init`): it waits for one."""

    pid: int
    spec_w: int  # the spec goes here (then closed); EOF without one makes the init exit
    go_w: int
    err_r: int
    mounts_w: int  # its mounts go here (one message, :func:`send_mounts`)
    userns: bool  # cloned into a user namespace of its own


#: What a prepared init's namespaces suit: none of execd's pre-bound sockets, a network namespace of its own.
_PREPARED_FLAGS = lx.CLONE_NEWPID | lx.CLONE_NEWNS | lx.CLONE_NEWUTS | lx.CLONE_NEWIPC | lx.CLONE_NEWNET


def prepare_init(close: tuple[int, ...], userns: bool = False) -> PreparedInit | None:
    """Clone the next sandbox's init while its zygote is idle (None if that fails: the start clones then).

    The clone (~1 ms: namespaces, a copy of this process), private mount propagation, ``lo`` up and the
    bounding set are the same for every sandbox, so a create no longer waits for them. The init holds no spec
    until it gets its own; it joins its cgroups when they exist (before ``go``: nothing of the workload runs
    outside them; the setup before that is charged to sandboxd's cgroup, as the supervisor's own work is).
    ``close``: the zygote's descriptors the init must not hold.
    """
    spec_r, spec_w = os.pipe2(os.O_CLOEXEC)
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    mounts_r, mounts_w = mounts_pair()
    try:
        pid = lx.clone3(_PREPARED_FLAGS | (lx.CLONE_NEWUSER if userns else 0))
    except OSError as exc:
        print(f"preparing an init failed (the start clones one): {exc}", flush=True)
        for fd in (spec_r, spec_w, go_r, go_w, err_r, err_w, mounts_r, mounts_w):
            os.close(fd)
        return None
    if pid == 0:
        code = 127
        try:
            for fd in (*close, spec_w, go_w, err_r, mounts_w):
                os.close(fd)
            code = _prepared_init_main(spec_r, go_r, err_w, mounts_r)
        finally:
            os._exit(code)
    for fd in (spec_r, go_r, err_w, mounts_r):
        os.close(fd)
    return PreparedInit(pid, spec_w, go_w, err_r, mounts_w, userns)


def _prepared_init_main(spec_r: int, go_r: int, err_w: int, mounts_r: int) -> int:
    """A prepared init: the spec-independent setup, then its spec, then :func:`in_namespace_setup`."""
    try:
        lx.mount(None, "/", None, lx.MS_REC | lx.MS_PRIVATE)
        netif.set_loopback_up()
        confine.drop_bounding_set()
        data = read_to_eof(spec_r)
        if not data:
            return 0  # the zygote is gone without a spec
        spec = SpawnSpec.from_json(data)
        log_fds = open_write_ends(spec.sandbox_dir, spec.output_pipes)
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            os.write(err_w, f"{type(exc).__name__}: {exc}".encode()[:4000])
        return 127
    in_namespace_setup(spec, log_fds, err_w, go_r, mounts_r, prepared=True)  # never returns
    return 127


def hand_to_prepared(init: PreparedInit | None, spec: SpawnSpec) -> PreparedInit | None:
    """Give ``spec`` to the prepared init when it suits it; None when the start must clone one (and then the
    prepared one, unusable or gone, is ended)."""
    if init is None:
        return None
    # Not for a warm pool member (started off any create's path, so the saving is moot): a prepared init opens
    # its output FIFOs itself, and in a user namespace that open was seen failing with EACCES now and then at a
    # daemon's first member starts; the supervisor's own clone opens them as host root. (EACCES was also seen,
    # rarely, on such an init's move_mount to the member's rootfs: cause not found; the refill retries.)
    suits = spec.network in ("none", "veth") and not spec.execd_sockets and not spec.warm
    if suits and init.userns == bool(spec.userns):
        data = spec.to_json()
        try:
            while data:
                data = data[os.write(init.spec_w, data) :]
            os.close(init.spec_w)
            return init
        except OSError:  # it died (killed?)
            pass
    with contextlib.suppress(OSError):
        os.close(init.spec_w)  # EOF without a spec: it exits
    with contextlib.suppress(ProcessLookupError):
        os.kill(init.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(init.pid, 0)
    os.close(init.go_w)
    os.close(init.err_r)
    os.close(init.mounts_w)
    return None
