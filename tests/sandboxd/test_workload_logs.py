"""Workload output kept by sandboxd: stream-tagged timestamped lines per log group, across sandboxes of the
group and sandboxd restarts, bounded by rotation, readable while being written (real sandboxes)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sbx_helpers import DaemonFactory

from adx.errors import NotFoundError
from adx.sandboxd import CreateRequest, LogsRequest, ref_of

SCRIPT = """
import sys, time
print("out one", flush=True)
print("err one", file=sys.stderr, flush=True)
sys.stdout.write("no newline")
sys.stdout.flush()
"""


async def test_stdout_and_stderr_are_tagged_timestamped_and_complete_at_exit(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        before = datetime.now(UTC)
        created = await c.create(CreateRequest(request_id="l1", argv=["python3", "-c", SCRIPT], log_group="env-a"))
        done = await c.wait(ref_of(created), timeout_seconds=20)
        assert done.done and done.sandbox.exit is not None and done.sandbox.exit.exit_code == 0, d.log()
        # Complete as soon as the exit is known: the supervisor drained the pipes before it recorded the exit.
        got = await c.logs(LogsRequest(group="env-a"))
        assert [(line.stream, line.text, line.partial) for line in got.lines] == [
            ("stdout", "out one", False),
            ("stderr", "err one", False),
            ("stdout", "no newline", True),
        ]
        sid = created.sandbox.sandbox_id
        assert {line.execution for line in got.lines} == {sid}
        assert all(before <= line.time <= datetime.now(UTC) for line in got.lines)
        # Nothing after the cursor; tail; since.
        assert (await c.logs(LogsRequest(group="env-a", cursor=got.cursor))).lines == []
        tail = await c.logs(LogsRequest(group="env-a", tail=1))
        assert [line.text for line in tail.lines] == ["no newline"]
        later = await c.logs(LogsRequest(group="env-a", since=datetime.now(UTC)))
        assert later.lines == []
        # The raw copy in the sandbox dir is still there for a person debugging sandboxd.
        assert "out one" in (d.sandbox_dir(sid) / "output.log").read_text()


async def test_follow_sees_new_lines_and_a_second_sandbox_of_the_group_continues_the_log(
    sandboxd: DaemonFactory,
) -> None:
    d = sandboxd()
    loop = "import time\nfor i in range(1000):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.2)\n"
    async with d.client() as c:
        first = await c.create(CreateRequest(request_id="f1", argv=["python3", "-c", loop], log_group="env-b"))
        got = await c.logs(LogsRequest(group="env-b", wait_seconds=10))
        assert got.lines and got.lines[0].text == "tick 0"
        # A waiting read returns as soon as a new line is there (well before its wait ends).
        t0 = time.monotonic()
        more = await c.logs(LogsRequest(group="env-b", cursor=got.cursor, wait_seconds=20))
        assert more.lines and time.monotonic() - t0 < 5
        assert int(more.lines[0].text.split()[1]) == int(got.lines[-1].text.split()[1]) + 1
        await c.delete(ref_of(first))
        # The next execution of the same group (a restart): its output follows the first one's.
        second = await c.create(
            CreateRequest(request_id="f2", argv=["python3", "-c", "print('second run')"], log_group="env-b")
        )
        await c.wait(ref_of(second), timeout_seconds=20)
        rest = await c.logs(LogsRequest(group="env-b", cursor=more.cursor, limit=10_000))
        assert rest.lines[-1].text == "second run"
        assert rest.lines[-1].execution == second.sandbox.sandbox_id
        full = await c.logs(LogsRequest(group="env-b", limit=10_000))
        assert full.lines[0].execution == first.sandbox.sandbox_id and full.lines[0].text == "tick 0"
        assert full.lines[-1] == rest.lines[-1]
        groups = {g.group for g in (await c.list_logs()).groups}
        assert "env-b" in groups
        await c.delete_logs("env-b")
        assert (await c.logs(LogsRequest(group="env-b"))).lines == []
        with pytest.raises(NotFoundError):
            await c.delete_logs("env-b")


async def test_output_keeps_flowing_across_a_sandboxd_restart(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    loop = "import time\nfor i in range(1000):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.05)\n"
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="r1", argv=["python3", "-c", loop], log_group="env-c"))
        first = await c.logs(LogsRequest(group="env-c", wait_seconds=10))
    d.kill()  # SIGKILL: sandboxd dies; the supervisor (which pumps the output) does not
    await asyncio.sleep(0.5)
    d.start()
    async with d.client() as c:
        got = await c.logs(LogsRequest(group="env-c", cursor=first.cursor, limit=10_000))
        ticks = [int(line.text.split()[1]) for line in got.lines]
        assert ticks == list(range(ticks[0], ticks[0] + len(ticks))), "no line lost or repeated"
        assert len(ticks) >= 8, "the workload kept writing while sandboxd was down"
        assert (await c.get(ref_of(created))).state.value == "running"


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if _parent(int(entry.name)) == pid:
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


async def test_the_supervisor_pumps_the_output_itself_a_partial_line_shows_while_running(
    sandboxd: DaemonFactory,
) -> None:
    """Issue 16: no process of its own for a sandbox's output (it cost ~2 MiB PSS per sandbox): the supervisor's
    only child is the init, and it still writes a line without a newline (partial) while the workload runs."""
    d = sandboxd()
    prog = "import sys, time\nsys.stdout.write('progress 50%')\nsys.stdout.flush()\ntime.sleep(60)\n"
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="p1", argv=["python3", "-c", prog], log_group="env-p"))
        got = await c.logs(LogsRequest(group="env-p", wait_seconds=10))
        assert [(line.stream, line.text, line.partial) for line in got.lines] == [("stdout", "progress 50%", True)]
        (init,) = d.settled_procs(created.sandbox.sandbox_id, count=1)
        assert _children(_parent(init)) == {init}
        await c.delete(ref_of(created))


async def test_a_group_is_bounded_by_rotation(sandboxd: DaemonFactory) -> None:
    d = sandboxd(logs_max_bytes=64 << 10, logs_segment_bytes=8 << 10)
    flood = "for i in range(20000):\n    print(f'line {i:06d} ' + 'x' * 40)\n"
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="b1", argv=["python3", "-c", flood], log_group="env-d"))
        await c.wait(ref_of(created), timeout_seconds=30)
        group = d.state_dir / "logs" / "env-d"
        sizes = [p.stat().st_size for p in group.iterdir()]
        assert sum(sizes) <= (64 << 10) + (8 << 10), sizes  # the bound, plus at most the segment being written
        assert len(sizes) > 1
        got = await c.logs(LogsRequest(group="env-d", limit=10_000))
        assert got.lines[-1].text.startswith("line 019999 ")
        numbers = [int(line.text.split()[1]) for line in got.lines]
        assert numbers == list(range(numbers[0], 20000)), "the newest output is kept, contiguous"
        # A cursor whose segment rotation removed continues at the oldest kept one and says so.
        stale = await c.logs(LogsRequest(group="env-d", cursor=f"{'0' * 20}-x-00000.jsonl:0"))
        assert stale.truncated and stale.lines[0].text == got.lines[0].text
