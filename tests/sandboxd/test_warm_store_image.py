"""A warm member of a store image (Debian) starts execd's interpreter and imports execd before any claim
(``adx.execd._prestart``, issue 16): the claimed sandbox is what a cold create makes — same uid, cwd, environment,
host name, /proc view of PID 1, confinement, sockets, activity — and a member that is never claimed, or whose
sandboxd is SIGKILLed, leaves no process. docs/images.md, 'The default image'."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from sbx_helpers import LAYOUT, Daemon, DaemonFactory, wait_until
from test_images import CACHE, _exec_ready, debian_store  # noqa: F401 - the session's Debian image (a fixture)
from test_runtime_control import execd_call, ready, run, until

from adx.images import ImageStore
from adx.sandboxd import (
    CreateRequest,
    CreateResponse,
    ExecdOptions,
    ResourcesSpec,
    RuntimeControlSubscription,
    SandboxdClient,
    ref_of,
)

pytestmark = pytest.mark.slow

#: The claim's own environment: nothing Python reads at start-up (the member serves it in process).
ENV = {"X": "claimed", "Y": "two words"}
#: What every sandbox below reports about itself (IDs blanked by ``_same``). A rewritten argv area keeps its size:
#: its trailing NULs (``adx.execd._process_args``) are not compared.
SHOW = (
    "id -u; id -un; pwd; hostname; env | sort; cat /proc/1/cmdline | tr '\\0' ' ' | sed 's/ *$//'; "
    "grep -E '^(Cap|Seccomp|NoNewPrivs|Uid)' /proc/1/status; ls /proc/1/fd | sort -n | tr '\\n' ' '; echo; "
    "cat /proc/1/environ | tr '\\0' '\\n' | grep -v '^$' | sort"
)


def _request(sandbox_id: str, env: dict[str, str] | None = None) -> CreateRequest:
    return CreateRequest(
        request_id=sandbox_id,
        sandbox_id=sandbox_id,
        image="debian",
        argv=[],
        env=ENV if env is None else env,
        execd=ExecdOptions(execution_id="x-store"),
        resources=ResourcesSpec(cpu_millis=1000, memory_bytes=256 << 20),
    )


@pytest.fixture
def d(request: pytest.FixtureRequest, sandboxd: DaemonFactory, debian_store: ImageStore) -> Daemon:  # noqa: F811
    """One member per shape; user namespaces on (the host name is set across one) unless the test's parameter
    (``indirect``) says "off"."""
    return sandboxd(images_dir=str(CACHE), warm_pool=1, user_namespace=getattr(request, "param", "on"))


def _nspid(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[-1]


def _prestarted(d: Daemon) -> dict[str, int]:
    """Parked members whose PID 1 is the pre-started execd: cgroup name -> host PID of that PID 1."""
    assert LAYOUT.v2_root is not None
    found = {}
    for cg in (LAYOUT.v2_root / d.cgroup_parent).glob("_warm-*"):
        try:
            for pid in (int(x) for x in (cg / "cgroup.procs").read_text().split()):
                if _nspid(pid) == "1" and b"adx.execd._prestart" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found[cg.name] = pid
        except (OSError, StopIteration):
            continue  # a member being started or removed meanwhile
    return found


def _parent(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("PPid:")).split()[1])


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


async def _settled(c: SandboxdClient, d: Daemon, prestarted: int = 1) -> dict[str, int]:
    """Wait for the pool to be full and ``prestarted`` Debian members to be parked; returns those."""
    deadline = time.monotonic() + 60
    while True:
        pool = (await c.health()).warm_pool
        members = _prestarted(d)
        if pool is not None and not pool.starting and len(members) >= prestarted:
            return members
        assert time.monotonic() < deadline, (pool, members)
        await asyncio.sleep(0.05)


async def _create(
    c: SandboxdClient, request: CreateRequest, members: dict[str, int] | None = None
) -> tuple[CreateResponse, str]:
    """Create and wait until its execd serves: the response and execd's socket. ``members``: it claims one."""
    created = await c.create(request)
    if members is not None:
        assert created.sandbox.native is not None and Path(created.sandbox.native.cgroup_dir).name in members
    socket = created.sandbox.execd_socket
    assert socket is not None
    await _exec_ready(socket)
    return created, socket


def _same(text: str, *ids: str) -> str:
    for sandbox_id in ids:
        text = text.replace(sandbox_id, "SID")
    return text


def _pid1_environ(created: CreateResponse) -> bytes:
    assert created.sandbox.native is not None
    cgroup = Path(created.sandbox.native.cgroup_dir)
    pid = next(p for p in (int(x) for x in (cgroup / "cgroup.procs").read_text().split()) if _nspid(p) == "1")
    return Path(f"/proc/{pid}/environ").read_bytes()


@pytest.mark.req("CTL-1", "SEC-3")
@pytest.mark.parametrize("d", ["on", "off"], indirect=True)
async def test_a_claimed_debian_member_is_served_by_its_prestarted_execd_exactly_as_a_cold_create(
    d: Daemon,
) -> None:
    async with d.client() as c:
        health = await c.health()
        assert health.runtime_control_socket is not None
        async with RuntimeControlSubscription(health.runtime_control_socket) as sub:
            cold, cold_socket = await _create(c, _request("store-cold"))  # learns the shape: cold
            members = await _settled(c, d)
            # The pre-started member is claimed: its PID 1 is the sandbox's.
            warm, warm_socket = await _create(c, _request("store-warm"), members)
            pool = (await c.health()).warm_pool
            assert pool is not None and (pool.claims, pool.misses) == (1, 1)
            await until(sub, ready("store-cold", "store-warm"))
            outputs = {}
            for created, socket in ((cold, cold_socket), (warm, warm_socket)):
                out, code = await run(socket, SHOW)
                assert code == 0, out
                outputs[created.sandbox.sandbox_id] = _same(out, "store-cold", "store-warm")
                # A file written is there (the sandbox's own writable layer), through a new command.
                out, code = await run(socket, f"echo kept > note-{created.sandbox.sandbox_id} && cat note-*")
                assert (out, code) == ("kept\n", 0)
                assert (await execd_call(socket, "GET", "/v1/health")).status_code == 200
            assert outputs["store-warm"] == outputs["store-cold"]
            shown = outputs["store-warm"]
            assert shown.split("\n")[1:4] == ["user", "/home/user", "SID"], shown  # user, cwd, host name
            assert "X=claimed\n" in shown and "Y=two words\n" in shown
            assert "python3 -m adx.execd --socket-fd 3 --admin-socket-fd 4" in shown
            # execd reports activity for the claimed sandbox as for the cold one (a command ran in each).
            await until(sub, lambda s: all(s[i].activity.version > 0 for i in ("store-cold", "store-warm")))
            # The cold PID 1 exec'd its environment; the pre-started one rewrote its area in place (with room).
            cold_env, warm_env = _pid1_environ(cold), _pid1_environ(warm)
            assert not cold_env.endswith(b"\0\0") and warm_env.endswith(b"\0" * 1024)
            assert _same((warm_env.rstrip(b"\0") + b"\0").decode(), "store-warm") == _same(
                cold_env.decode(), "store-cold"
            )
            for created in (cold, warm):
                await c.delete(ref_of(created))


async def test_a_claim_with_its_own_start_up_environment_execs_the_interpreter_as_a_cold_start(
    d: Daemon,
) -> None:
    """``PYTHONDONTWRITEBYTECODE`` (read by the interpreter at start): the pre-started execd cannot become it, so
    it execs the claim's argv and environment, exactly the cold start's exec."""
    env = {**ENV, "PYTHONDONTWRITEBYTECODE": "1"}
    async with d.client() as c:
        first = await c.create(_request("own-env-cold", env))
        members = await _settled(c, d)
        created, socket = await _create(c, _request("own-env-warm", env), members)
        out, code = await run(socket, "echo $PYTHONDONTWRITEBYTECODE $X; hostname")
        assert (out, code) == ("1 claimed\nown-env-warm\n", 0)
        warm_env = _pid1_environ(created)
        assert not warm_env.endswith(b"\0\0")  # exec'd: the area is exactly the claim's environment
        assert _same(warm_env.decode(), "own-env-warm") == _same(_pid1_environ(first).decode(), "own-env-cold")
        for sandbox in (first, created):
            await c.delete(ref_of(sandbox))


async def test_members_never_claimed_leave_no_process(
    d: Daemon,
) -> None:
    """A member whose supervisor is gone reads EOF instead of a claim and exits by itself; what is left of the
    pool is removed when sandboxd stops."""
    async with d.client() as c:
        await c.delete(ref_of(await c.create(_request("drop-cold"))))
        members = await _settled(c, d)
        (pid,) = members.values()
        os.kill(_parent(pid), signal.SIGKILL)  # the member's supervisor
        wait_until(lambda: not _alive(pid))
    d.stop()
    wait_until(lambda: not _prestarted(d))
    assert not _prestarted(d)


@pytest.mark.req("SBX-10")
async def test_sigkill_of_sandboxd_with_prestarted_members_leaves_no_orphan_and_creates_work_after_restart(
    d: Daemon,
) -> None:
    async with d.client() as c:
        await c.delete(ref_of(await c.create(_request("kill-cold"))))
        members = await _settled(c, d)
    d.kill()
    d.start()
    wait_until(lambda: not any(_alive(p) for p in members.values()), timeout=30)
    async with d.client() as c:
        assert not members.keys() & _prestarted(d).keys()
        created, socket = await _create(c, _request("after-restart"))  # the shape is learned again: cold
        assert await run(socket, "echo $X") == ("claimed\n", 0)
        await c.delete(ref_of(created))
        claimed, socket = await _create(c, _request("claimed-after-restart"), await _settled(c, d))
        assert await run(socket, "hostname; echo $X") == ("claimed-after-restart\nclaimed\n", 0)
        await c.delete(ref_of(claimed))
