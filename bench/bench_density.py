"""Density and create throughput on one ``adx up`` node (issue 16).

    uv run python bench/bench_density.py [--n 100] [--clients 32] [--cpu-millis 10] [--memory-mib 32] [--disk-mib 64]

1. ``creates``: n Environments created by ``--clients`` concurrent SDK clients, each ``create(wait=True)``
   (answered once running): creates per second (goal >= 50/s at 32 clients), the create latency and the CPU the
   stack spent per create, by process. Baselines, same run: creates per second of one client, one after the
   other (``--baseline-creates``, deleted again); with ``--poll-baseline``, first the same n creates by the same
   clients on the SDK's path before the server-side wait (``create(wait=False)``, a GET every 15 ms).
2. ``memory``: with the n idle, the PSS (``/proc/PID/smaps_rollup``: shared pages split among their sharers, so
   the sum is what the host spends) of every process of the stack, from before the creates to after:
   ``sandbox_processes`` (per Environment: its supervisor, execd and anything they run; ``by_kind``: each kind's
   mean ``smaps_rollup`` fields, private and shared, with a supervisor's output pump a kind of its own) and
   ``daemons_growth`` (the bookkeeping the n add to the Coordinator, Redis, adxlet, sandboxd, API), each per
   Environment, and ``mem_available_drop`` (``/proc/meminfo``: adds the kernel's share, cgroups, namespaces,
   page tables, mounts; it also moves with anything else the machine runs). Baseline, same run: the PSS of a
   bare ``python3 -c 'sleep'`` process on the host, the floor of any Python process.
3. ``commands``: ``true`` run in every idle Environment, one after the other (each one's latency: the goal is
   that all answer within 2 s) and then by ``--clients`` concurrent clients (the sweep's wall time).
4. ``capacity_refusal``: a create no node has room for answers 503 ``no_capacity`` with ``Retry-After``.

CPU and memory per Environment are small (``--cpu-millis``, ``--memory-mib``) so that n fit the node's
capacity (``adx up`` overcommits CPU 4x; memory is never overcommitted). The store is seeded with the Debian image
of the tests' cache (as ``bench_tti.py``; ``--no-seed``: ``adx up`` builds it, ~90 s). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _harness import emit, percentile, progress
from bench_api import start_cluster, stop_cluster
from bench_e2b_templates import _seed_debian as seed_debian

import adx

#: The SDK's poll before ``?wait=running`` (issue 16): a GET every 15 ms.
OLD_POLL_SECONDS = 0.015


#: What ``stack_pss`` reads of each sandbox process (``/proc/PID/smaps_rollup``, KiB): PSS splits shared pages
#: among their sharers; Private_Dirty is what the process copied of what it inherited or allocated (a forked
#: process's own cost), Private_Clean and Shared_* what it maps of files and of its parent's untouched pages.
ROLLUP_FIELDS = ("Pss", "Private_Dirty", "Private_Clean", "Shared_Dirty", "Shared_Clean")


def rollup_kib(pid: int) -> dict[str, int]:
    """The process's ``ROLLUP_FIELDS`` in KiB (zeros when it is gone)."""
    found = dict.fromkeys(ROLLUP_FIELDS, 0)
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in found:
                found[name] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return found


def pss_kib(pid: int) -> int:
    """The process's PSS in KiB (0 when it is gone)."""
    return rollup_kib(pid)["Pss"]


def descendants(root: int) -> dict[int, int]:
    """Every process under ``root`` (included), each with its parent."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree = {root: parents.get(root, 0)}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree[pid] = parent
                grew = True
    return tree


def stack_pss(up_pid: int) -> dict[str, int]:
    """PSS (KiB) of the stack: ``daemons`` (``adx up`` and its direct children, the daemons and servers, plus
    their own helpers up to sandboxd's spawner and template) and ``sandboxes`` (everything below: supervisors,
    execd, commands), with the process counts."""
    tree = descendants(up_pid)
    daemons = {up_pid} | {pid for pid, parent in tree.items() if parent == up_pid}
    # sandboxd's spawner and its template are node bookkeeping, not a sandbox's: two levels below sandboxd.
    helpers = {pid for pid, parent in tree.items() if parent in daemons and pid not in daemons}
    helpers |= {pid for pid, parent in tree.items() if parent in helpers and _is_template(pid)}
    fixed = daemons | helpers
    sandbox_pids = [pid for pid in tree if pid not in fixed]
    supervisors = {pid for pid in sandbox_pids if tree[pid] in helpers and not _is_pid1(pid)}
    kinds: dict[str, list[dict[str, int]]] = {}
    for pid in sandbox_pids:
        if _is_pid1(pid):
            kind = "pid1"
        elif pid in supervisors:
            kind = "supervisor"
        elif tree[pid] in supervisors and _is_pump(pid):
            kind = "pump"  # the supervisor's output pump (its other child is the sandbox's PID 1)
        else:
            kind = "other"  # idle zygotes and their prepared inits, commands
        kinds.setdefault(kind, []).append(rollup_kib(pid))
    return {
        "daemons_kib": sum(pss_kib(pid) for pid in fixed),
        "daemon_processes": len(fixed),
        "sandboxes_kib": sum(r["Pss"] for v in kinds.values() for r in v),
        "sandbox_processes": len(sandbox_pids),
        # execd as each sandbox's PID 1, the supervisors (children of sandboxd's spawner or its template), their
        # output pumps, anything else: processes, mean PSS, and the mean of each smaps_rollup field
        "by_kind": {
            k: {
                "processes": len(v),
                "mean_kib": round(sum(r["Pss"] for r in v) / len(v)),
                "mean_rollup_kib": {f: round(sum(r[f] for r in v) / len(v)) for f in ROLLUP_FIELDS},
            }
            for k, v in sorted(kinds.items())
        },
    }


def stack_cpu(up_pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of each daemon with its helpers (sandboxd: with its spawner and
    template), and of all sandbox processes together (``sandboxes``)."""
    tree = descendants(up_pid)
    roles: dict[int, str] = {}
    for pid, parent in tree.items():
        if parent == up_pid:
            try:
                words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            roles[pid] = words[3] if words[1:3] == ["-m", "adx"] and len(words) > 3 else Path(words[0]).name
    totals: dict[str, float] = {}
    for pid in tree:
        owner, depth = pid, 0
        while owner in tree and owner not in roles and owner != up_pid:
            owner, depth = tree[owner], depth + 1
        role = roles.get(owner, "adx up")
        # sandboxd (depth 0), its spawner (1) and template (2, in their session) are bookkeeping; the rest below
        # (zygotes, supervisors, execd and what it runs) belongs to the sandboxes
        if role == "sandboxd" and (depth > 2 or (depth == 2 and not _is_template(pid))):
            role = "sandboxes"
        totals[role] = totals.get(role, 0.0) + cpu_seconds(pid)
    return totals


def cpu_per_create(before: dict[str, float], after: dict[str, float], creates: int) -> dict[str, float]:
    per = {role: round((after[role] - before.get(role, 0.0)) * 1e3 / max(creates, 1), 1) for role in sorted(after)}
    per["total"] = round(sum(per.values()), 1)
    return per


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _is_pid1(pid: int) -> bool:
    """PID 1 of a PID namespace below the host's (a sandbox's init: execd)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                ids = line.split()[1:]
                return len(ids) > 1 and ids[-1] == "1"
    except OSError:
        pass
    return False


def _is_pump(pid: int) -> bool:
    """A supervisor's output pump: in the host's PID namespace (the supervisor's other child is a PID 1)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return len(line.split()) == 2
    except OSError:
        pass
    return False


def _is_template(pid: int) -> bool:
    """The spawner's execd template: a child of the spawner with the spawner's command line, in its session."""
    try:
        return os.getsid(pid) == os.getsid(int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]))
    except (OSError, ValueError):
        return False


def mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise SystemExit("no MemAvailable in /proc/meminfo")


def python_floor_kib() -> int:
    """PSS of a bare Python process (this interpreter, no imports beyond ``time``), same run."""
    proc = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)
        return pss_kib(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def latency(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(samples, 50) * 1e3, 1),
        "p99_ms": round(percentile(samples, 99) * 1e3, 1),
        "max_ms": round(max(samples) * 1e3, 1),
    }


async def create_many(
    client: adx.AsyncClient, n: int, clients: int, cpu: float, memory: int, disk: int, *, poll: bool = False
) -> tuple[list[adx.AsyncEnvironment], list[float], float, list[str]]:
    """``poll``: the SDK's path before the server-side wait (``create(wait=False)``, then a GET every 15 ms)."""
    made: list[adx.AsyncEnvironment] = []
    samples: list[float] = []
    errors: list[str] = []
    todo = iter(range(n))

    async def worker() -> None:
        for _ in todo:
            start = time.perf_counter()
            try:
                if poll:
                    env = await client.environments.create(cpu=cpu, memory=memory, disk=disk, wait=False)
                    while env.state in ("pending", "starting"):
                        await asyncio.sleep(OLD_POLL_SECONDS)
                        await env.refresh()
                else:
                    env = await client.environments.create(
                        cpu=cpu, memory=memory, disk=disk, wait=60.0, wait_timeout=120
                    )
            except adx.AdxError as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            samples.append(time.perf_counter() - start)
            made.append(env)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return made, samples, time.perf_counter() - start, errors


async def run_true(envs: list[adx.AsyncEnvironment], clients: int) -> tuple[list[float], float, int]:
    samples: list[float] = []
    failed = 0
    todo = iter(envs)

    async def worker() -> None:
        nonlocal failed
        for env in todo:
            start = time.perf_counter()
            try:
                ok = (await env.commands.run("true")).exit_code == 0
            except adx.AdxError:
                ok = False
            samples.append(time.perf_counter() - start)
            failed += not ok

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return samples, time.perf_counter() - start, failed


async def delete_all(envs: list[adx.AsyncEnvironment], clients: int) -> None:
    todo = iter(envs)

    async def worker() -> None:
        for env in todo:
            try:
                await env.delete()
            except adx.AdxError as exc:
                progress(f"delete {env.id}: {exc}")

    await asyncio.gather(*(worker() for _ in range(clients)))


async def wait_gone(client: adx.AsyncClient, within: float) -> int:
    """Until every Environment is deleted (or ``within`` ran out): how many were left."""
    deadline = time.monotonic() + within
    while True:
        left = sum(e.state != "deleted" for e in await client.environments.list())
        if not left or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.5)
    if left:
        progress(f"{left} Environments were not deleted within {within:g}s")
    return left


async def bench(url: str, key: str, up_pid: int, args: argparse.Namespace) -> dict[str, Any]:
    cpu, memory, disk = args.cpu_millis / 1000, args.memory_mib * 2**20, args.disk_mib * 2**20
    figures: dict[str, Any] = {"n": args.n, "clients": args.clients, "cpu_millis": args.cpu_millis}
    figures["memory_mib"], figures["disk_mib"] = args.memory_mib, args.disk_mib
    async with adx.AsyncClient(api_url=url, api_key=key, timeout=60) as client:
        warm = await client.environments.create(cpu=cpu, memory=memory, disk=disk)  # every code path loaded once
        await warm.commands.run("true")
        await warm.delete()
        await wait_gone(client, 60)

        progress(f"baseline: {args.baseline_creates} creates by one client")
        one, one_samples, one_wall, one_errors = await create_many(client, args.baseline_creates, 1, cpu, memory, disk)
        figures["baseline_one_client"] = {
            "creates_per_second": round(len(one) / one_wall, 1),
            "create_latency": latency(one_samples) if one_samples else {},
            "errors": one_errors[:5],
        }
        await delete_all(one, args.clients)
        await wait_gone(client, 120)

        if args.poll_baseline:
            progress(f"baseline: {args.n} creates by {args.clients} clients, each polling for running (before)")
            cpu_before = stack_cpu(up_pid)
            polled, poll_samples, poll_wall, poll_errors = await create_many(
                client, args.n, args.clients, cpu, memory, disk, poll=True
            )
            cpu_after = stack_cpu(up_pid)
            figures["baseline_creates_polling"] = {
                "ok": len(polled),
                "creates_per_second": round(len(polled) / poll_wall, 1),
                "create_latency": latency(poll_samples) if poll_samples else {},
                "cpu_ms_per_create": cpu_per_create(cpu_before, cpu_after, len(polled)),
                "errors": sorted(set(poll_errors))[:5],
            }
            progress(f"  {figures['baseline_creates_polling']}")
            await delete_all(polled, args.clients)
            await wait_gone(client, 300)

        await asyncio.sleep(2)  # the daemons settle after the deletes
        before = stack_pss(up_pid)
        available_before = mem_available_kib()
        progress(f"{args.n} creates by {args.clients} clients")
        cpu_before = stack_cpu(up_pid)
        envs, samples, wall, errors = await create_many(client, args.n, args.clients, cpu, memory, disk)
        cpu_after = stack_cpu(up_pid)
        figures["creates"] = {
            "ok": len(envs),
            "creates_per_second": round(len(envs) / wall, 1),
            "wall_s": round(wall, 2),
            "create_latency": latency(samples) if samples else {},
            "goal_50_per_second": len(envs) / wall >= 50,
            # CPU the stack spent per create (the bench's SDK clients not included), by process: what bounds
            # the rate on a machine of 2 cores
            "cpu_ms_per_create": cpu_per_create(cpu_before, cpu_after, len(envs)),
            "errors": sorted(set(errors))[:5],
        }
        progress(f"  {figures['creates']}")

        progress("idle: settling, then PSS")
        idle_before, idle_started = stack_cpu(up_pid), time.monotonic()
        await asyncio.sleep(args.settle)
        idle_after, idle_seconds = stack_cpu(up_pid), time.monotonic() - idle_started
        after = stack_pss(up_pid)
        available_after = mem_available_kib()
        count = max(len(envs), 1)
        floor = python_floor_kib()
        figures["memory"] = {
            "per_environment_kib": {
                "sandbox_processes": round(after["sandboxes_kib"] / count),
                "daemons_growth": round((after["daemons_kib"] - before["daemons_kib"]) / count),
                "total_pss": round(
                    (after["sandboxes_kib"] + after["daemons_kib"] - before["daemons_kib"] - before["sandboxes_kib"])
                    / count
                ),
                "mem_available_drop": round((available_before - available_after) / count),
            },
            "sandbox_processes_per_environment": round(after["sandbox_processes"] / count, 2),
            # What n idle Environments cost in CPU while nothing is asked of them (heartbeats, usage samples,
            # runtime-control reports): CPU milliseconds per second of wall time, per idle Environment, by process
            "idle_cpu_ms_per_second_per_environment": {
                role: round(ms / idle_seconds, 3)
                for role, ms in cpu_per_create(idle_before, idle_after, len(envs)).items()
            },
            "before": before,
            "after": after,
            "baseline_bare_python_process_kib": floor,
        }
        progress(f"  {figures['memory']['per_environment_kib']}")

        progress(f"`true` in each of {len(envs)} idle Environments, one after the other")
        seq, seq_wall, seq_failed = await run_true(envs, 1)
        progress(f"`true` in each again, {args.clients} clients")
        par, par_wall, par_failed = await run_true(envs, args.clients)
        # Again after the commands: what serving requests copied into each sandbox's private pages.
        served = stack_pss(up_pid)
        figures["memory"]["after_commands"] = {
            "per_environment_kib": round(
                (served["sandboxes_kib"] + served["daemons_kib"] - before["daemons_kib"] - before["sandboxes_kib"])
                / count
            ),
            "by_kind": served["by_kind"],
        }
        figures["commands"] = {
            "sequential": {**latency(seq), "failed": seq_failed, "wall_s": round(seq_wall, 2)},
            "all_answered_within_2s_each": seq_failed == 0 and max(seq) <= 2.0,
            "concurrent": {**latency(par), "failed": par_failed, "wall_s": round(par_wall, 2)},
        }
        progress(f"  {figures['commands']}")

        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as http:
            refused = await http.post(
                "/v1/environments", json={"resources": {"cpuMillis": 1000, "memoryBytes": 1 << 50}}
            )
        error = refused.json().get("error", {}) if refused.status_code >= 400 else {}
        figures["capacity_refusal"] = {
            "status": refused.status_code,
            "code": error.get("code"),
            "message": error.get("message"),
            "retry_after": refused.headers.get("retry-after"),
            "ok": (refused.status_code, error.get("code")) == (503, "no_capacity") and "retry-after" in refused.headers,
        }
        progress(f"deleting {len(envs)}")
        start = time.perf_counter()
        await delete_all(envs, args.clients)
        answered = time.perf_counter() - start
        left = await wait_gone(client, 300)
        figures["deletes"] = {
            "n": len(envs),
            "clients": args.clients,
            "all_answered_s": round(answered, 1),
            "all_deleted_s": round(time.perf_counter() - start, 1),
            "not_deleted": left,
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100, help="idle Environments (the goal: 500)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--cpu-millis", type=int, default=10)
    parser.add_argument("--memory-mib", type=int, default=32)
    parser.add_argument(
        "--disk-mib", type=int, default=64, help="reserved per Environment (the node admits disk by reservation)"
    )
    parser.add_argument("--baseline-creates", type=int, default=10)
    parser.add_argument(
        "--poll-baseline", action="store_true", help="first the same creates with the SDK's old poll, deleted again"
    )
    parser.add_argument("--settle", type=float, default=10.0, help="seconds idle (CPU read) before PSS is read")
    parser.add_argument("--no-seed", action="store_true", help="let adx up build the Debian image (no cache)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="adx-bench-density-", dir="/tmp") as tmp:
        if not args.no_seed:
            progress("seeding the Debian image from the tests' cache")
            seed_debian(Path(tmp) / "state")
        progress("starting adx up")
        proc, url, key = start_cluster(Path(tmp))
        try:
            figures = asyncio.run(bench(url, key, proc.pid, args))
        finally:
            stop_cluster(proc)
    emit("density", figures)


if __name__ == "__main__":
    main()
