"""execd as PID 1 without an exec: forked from the spawner's pristine template, which imported execd before it
read any request (``execd_in_process``, the default), against the exec of a fresh interpreter (the fallback).
"""

from __future__ import annotations

import contextlib
import re
import secrets
from pathlib import Path

import pytest
from sbx_helpers import Daemon, DaemonFactory
from test_runtime_control import execd_request, ready, run, until

from adx.sandboxd import CreateRequest, RuntimeControlSubscription, ref_of


def _pid1(d: Daemon, sandbox_id: str) -> int:
    for pid in d.cgroup_procs(sandbox_id):
        status = Path(f"/proc/{pid}/status").read_text()
        if next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[-1] == "1":
            return pid
    raise AssertionError(f"no PID 1 in {sandbox_id}")


def _memory_holds(pid: int, needle: bytes) -> bool:
    """Whether any readable mapping of ``pid`` contains ``needle`` (host side, as root)."""
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            span, perms = line.split()[:2]
            if not perms.startswith("r") or line.endswith(("[vvar]", "[vsyscall]", "[vvar_vclock]")):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            with contextlib.suppress(OSError):
                mem.seek(start)
                if needle in mem.read(end - start):
                    return True
    return False


def _in_process(pid: int) -> bool:
    """execd never imports ctypes; the template PID 1 is forked from did (clone3, mounts)."""
    return bool(re.search(r"_ctypes", Path(f"/proc/{pid}/maps").read_text()))


@pytest.mark.req("CTL-1", "SEC-3")
async def test_execd_pid1_runs_in_process_and_holds_nothing_of_other_sandboxes(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    secret = f"other-sandbox-secret-{secrets.token_hex(16)}"
    async with d.client() as c:
        health = await c.health()
        assert health.runtime_control_socket is not None
        # Other sandboxes' specs (their env) pass through the spawner before ours does.
        others = [
            await c.create(CreateRequest(request_id=f"o{i}", argv=["sleep", "1000"], env={"TOKEN": secret}))
            for i in range(3)
        ]
        async with RuntimeControlSubscription(health.runtime_control_socket) as sub:
            created = await c.create(execd_request("inproc", argv=["sleep", "1000"]))
            await until(sub, ready("inproc"))
        pid = _pid1(d, "inproc")
        assert _in_process(pid)
        assert _memory_holds(pid, b"inproc")  # the scan finds what is there: our own ID
        assert not _memory_holds(pid, secret.encode()), "another sandbox's spec leaked into this PID 1"

        socket = created.sandbox.execd_socket
        assert socket is not None
        # What an exec would have shown: execd's argv and the sandbox's environment, not the spawner's.
        out, code = await run(socket, "tr '\\0' '\\n' </proc/1/cmdline; echo; tr '\\0' '\\n' </proc/1/environ")
        assert code == 0
        lines = out.split("\n")
        assert lines[:3] == ["/usr/bin/python3", "-m", "adx.execd"] and "--socket-fd" in lines
        assert "ADX_SANDBOX_ID=inproc" in lines and "PYTHONPATH=/opt/adx" in lines
        assert not any("_spawner" in line for line in lines)
        assert [line for line in lines if line.startswith("PYTHONPATH=")] == ["PYTHONPATH=/opt/adx"]
        out, code = await run(socket, "echo hi; exit 3")
        assert (out, code) == ("hi\n", 3)
        await c.delete(ref_of(created))
        for other in others:
            await c.delete(ref_of(other))


@pytest.mark.req("CTL-1")
async def test_with_execd_in_process_off_pid1_execs_a_fresh_interpreter(sandboxd: DaemonFactory) -> None:
    d = sandboxd(execd_in_process=False)
    async with d.client() as c:
        health = await c.health()
        assert health.runtime_control_socket is not None
        async with RuntimeControlSubscription(health.runtime_control_socket) as sub:
            created = await c.create(execd_request("exec", argv=["sleep", "1000"]))
            await until(sub, ready("exec"))
        assert not _in_process(_pid1(d, "exec"))
        socket = created.sandbox.execd_socket
        assert socket is not None
        out, code = await run(socket, "tr '\\0' ' ' </proc/1/cmdline")
        assert code == 0 and out.startswith("/usr/bin/python3 -m adx.execd --socket-fd 3")
        await c.delete(ref_of(created))
