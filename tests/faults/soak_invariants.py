"""The soak's invariants: sampled during the run (two executions of one Environment) and checked at the end.

End checks, each cross-checked between the public API, Redis (the authority) and the real runtime (both
sandboxd inventories, the cgroup trees, the checkpoint listings, the adxlets' degradation journals):

- ``acked_env_exists``: every acknowledged, not-deleted Environment exists, in one state, the same through
  the API and in Redis; an acknowledged delete stays deleted.
- ``no_transitional_state``: no record is pending/starting/pausing/resuming/deleting.
- ``no_failed_env``: no Environment ended ``failed`` (this workload runs nothing that exits: a failure can
  only come from a fault).
- ``one_execution``: at most one live sandbox per Environment over both nodes, and it is the committed
  execution on the committed node; a running Environment has it, a paused/deleted one has none.
- ``no_orphan_sandbox`` / ``no_orphan_cgroup`` / ``no_orphan_checkpoint`` / ``no_orphan_reservation``:
  every runtime resource and reservation has an owner (a not-deleted record that references it).
- ``reservation_accounting``: each node's reserved totals are the sum of its reservation entries.
- ``journal_drained``: each node's ``degradation_journal`` (if the file exists) holds no pending row.
- ``acked_write_readable``: every acknowledged file of a kept Environment reads back (waking it if paused).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from soak_cluster import NodeProcesses, SoakCluster
from soak_workload import Ledger, Violation

import adx
from adx.errors import AdxError, NotFoundError
from adx.images import POOL_HOLDER_PREFIX as WARM_CGROUP_PREFIX  # sandboxd's member names
from adx.model import EnvironmentRecord
from adx.sandboxd import SandboxdClient
from adx.sandboxd._models import ListCheckpointsResponse, SandboxInfo

META_ENV = "adx.env"  # adx.runtime._sandboxd's sandbox metadata keys
META_EXECUTION = "adx.execution"
TRANSITIONAL = frozenset({"pending", "starting", "pausing", "resuming", "deleting"})
HOLDING = frozenset({"pending", "starting", "running", "pausing", "resuming"})
LIVE_SANDBOX = frozenset({"creating", "running", "paused"})
#: The degradation journal's table(s) of pending results (adx.node._journal); None would count the rows of
#: every table except SQLite's own and obvious metadata tables.
JOURNAL_PENDING_TABLES: tuple[str, ...] | None = ("pending_results",)
INVARIANTS = (
    "acked_env_exists",
    "no_transitional_state",
    "no_failed_env",
    "one_execution",
    "no_orphan_sandbox",
    "no_orphan_cgroup",
    "no_orphan_checkpoint",
    "no_orphan_reservation",
    "reservation_accounting",
    "journal_drained",
    "acked_write_readable",
    "nodes_registered",
    "no_daemon_crash",
)


# -- runtime observations ---------------------------------------------------------------------------------
async def sandboxes_of(node: NodeProcesses, timeout: float = 5.0) -> list[SandboxInfo] | None:  # noqa: ASYNC109
    client = SandboxdClient(node.sandboxd_socket, timeout=timeout)
    try:
        return await asyncio.wait_for(client.list(), timeout)
    except (AdxError, OSError, TimeoutError):
        return None
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()


async def checkpoints_of(node: NodeProcesses, timeout: float = 5.0) -> ListCheckpointsResponse | None:  # noqa: ASYNC109
    client = SandboxdClient(node.sandboxd_socket, timeout=timeout)
    try:
        return await asyncio.wait_for(client.list_checkpoints("local"), timeout)
    except (AdxError, OSError, TimeoutError):
        return None
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()


async def warm_members_of(node: NodeProcesses, timeout: float = 5.0) -> int | None:  # noqa: ASYNC109
    """How many pre-started members sandboxd's warm pool holds (each has a ``_warm-`` cgroup and is nobody's
    sandbox until a create claims it), or None when sandboxd does not answer."""
    client = SandboxdClient(node.sandboxd_socket, timeout=timeout)
    try:
        pool = (await asyncio.wait_for(client.health(), timeout)).warm_pool
        return 0 if pool is None else pool.ready + pool.starting
    except (AdxError, OSError, TimeoutError):
        return None
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()


def cgroups_of(node: NodeProcesses) -> set[str]:
    from sbx_helpers import _hierarchy_roots

    names: set[str] = set()
    for root in _hierarchy_roots():
        base = root / node.cgroup_parent
        if base.is_dir():
            names |= {child.name for child in base.iterdir() if child.is_dir()}
    return names


def journal_pending(path: Path) -> tuple[int, str]:
    """(pending rows, how they were counted); a missing file is an empty journal (JRN-1)."""
    if not path.exists():
        return 0, "no journal file"
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        if JOURNAL_PENDING_TABLES is not None:
            counted = [t for t in tables if t in JOURNAL_PENDING_TABLES]
        else:
            skip = ("sqlite_", "meta", "schema", "version", "migration")
            counted = [t for t in tables if not any(t.lower().startswith(s) for s in skip)]
        total = 0
        for table in counted:
            total += int(conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0])
        return total, f"tables {counted} of {tables}"
    finally:
        conn.close()


class ExecutionSampler:
    """During the run: two live executions of one Environment, seen in consecutive samples, is a violation
    (one sample may straddle a legitimate hand-over; the same pair twice, seconds apart, cannot)."""

    def __init__(self, cluster: SoakCluster, ledger: Ledger, interval: float = 2.0) -> None:
        self.cluster = cluster
        self.ledger = ledger
        self.interval = interval
        self.samples = 0
        self._previous: dict[str, frozenset[str]] = {}
        self._streak: Counter[str] = Counter()
        self._reported: set[frozenset[str]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sample_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    async def sample_once(self) -> None:
        live: dict[str, set[str]] = {}
        running: dict[str, set[str]] = {}
        for node in self.cluster.nodes.values():
            if node.sandboxd.stopped:
                continue
            listing = await sandboxes_of(node, timeout=2.0)
            for info in listing or []:
                env_id = info.metadata.get(META_ENV, "?")
                tag = f"{node.name}/{info.sandbox_id}"
                if info.state.value in LIVE_SANDBOX:
                    live.setdefault(env_id, set()).add(tag)
                if info.state.value == "running":
                    running.setdefault(env_id, set()).add(tag)
        self.samples += 1
        current = {env: frozenset(tags) for env, tags in live.items() if len(tags) > 1}
        for env_id, tags in current.items():
            self._streak[env_id] = self._streak[env_id] + 1 if self._previous.get(env_id) == tags else 1
            both_running = len(running.get(env_id, set()) & tags) > 1
            persistent = (both_running and self._streak[env_id] >= 2) or self._streak[env_id] >= 3
            if persistent and tags not in self._reported:
                self._reported.add(tags)
                how = "running" if both_running else "live (running/paused/creating)"
                self.ledger.violation(
                    "one_execution", env_id, f"{len(tags)} {how} sandboxes in consecutive samples: {sorted(tags)}"
                )
        for env_id in list(self._streak):
            if env_id not in current:
                del self._streak[env_id]
        self._previous = current


# -- end checks ---------------------------------------------------------------------------------------------
@dataclass
class Snapshot:
    records: dict[str, EnvironmentRecord]
    reservations: dict[str, dict[str, str]]  # node -> env id -> "cpu mem disk"
    node_totals: dict[str, tuple[int, int, int]]
    sessions: dict[str, float]  # node -> its session's expiry (Unix time)
    retired: set[str]
    sandboxes: dict[str, list[SandboxInfo] | None]
    checkpoints: dict[str, ListCheckpointsResponse | None]
    cgroups: dict[str, set[str]]
    warm_members: dict[str, int | None] = field(default_factory=dict)  # node -> its warm pool's ready + starting


def _redis_snapshot(url: str) -> tuple[Any, ...]:
    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5, decode_responses=True)
    try:
        records: dict[str, EnvironmentRecord] = {}
        for key in client.scan_iter(match="adx:env:*", count=500):
            doc = client.hget(key, "doc")
            if doc is not None:
                record = EnvironmentRecord.model_validate_json(doc)
                records[record.id] = record
        reservations: dict[str, dict[str, str]] = {}
        totals: dict[str, Any] = {}
        sessions: dict[str, float] = {}
        for node in client.smembers("adx:nodes"):
            reservations[node] = dict(client.hgetall(f"adx:node-res:{node}"))
            h = client.hgetall(f"adx:node:{node}")
            totals[node] = tuple(int(h.get(k, 0) or 0) for k in ("res_cpu", "res_mem", "res_disk"))
            sessions[node] = float(h.get("session_expires_at", 0) or 0)
        retired = set(client.smembers("adx:ckpts-retired"))
        return records, reservations, totals, retired, sessions
    finally:
        client.close()


async def snapshot(cluster: SoakCluster) -> Snapshot:
    records, reservations, totals, retired, sessions = await asyncio.to_thread(_redis_snapshot, cluster.redis.url)
    sandboxes = {name: await sandboxes_of(node) for name, node in cluster.nodes.items()}
    checkpoints = {name: await checkpoints_of(node) for name, node in cluster.nodes.items()}
    cgroups = {name: await asyncio.to_thread(cgroups_of, node) for name, node in cluster.nodes.items()}
    warm = {name: await warm_members_of(node) for name, node in cluster.nodes.items()}
    return Snapshot(records, reservations, totals, sessions, retired, sandboxes, checkpoints, cgroups, warm)


@dataclass
class CheckResult:
    checked: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fail(self, invariant: str, subject: str, detail: str, clock: Callable[[], float]) -> None:
        self.violations.append(Violation(invariant, subject, detail, round(clock(), 2)))


async def api_states(client: adx.AsyncClient, ids: list[str]) -> dict[str, str]:
    """Each Environment's state through the public API ("absent" for 404, "error: ..." if unreachable)."""
    out: dict[str, str] = {}
    for env_id in ids:
        for attempt in range(5):
            try:
                out[env_id] = (await client.environments.get(env_id)).state.value
                break
            except NotFoundError:
                out[env_id] = "absent"
                break
            except (AdxError, OSError) as exc:
                out[env_id] = f"error: {exc}"
                await asyncio.sleep(1.0 + attempt)
    return out


async def structural_checks(
    cluster: SoakCluster, ledger: Ledger, client: adx.AsyncClient, clock: Callable[[], float]
) -> tuple[CheckResult, Snapshot]:
    result = CheckResult()
    snap = await snapshot(cluster)
    records = snap.records
    api = await api_states(client, sorted(ledger.envs))

    # acked_env_exists (and an acknowledged delete stays deleted)
    for env_id, entry in sorted(ledger.envs.items()):
        result.checked["acked_env_exists"] += 1
        record = records.get(env_id)
        seen = api[env_id]
        stored = record.state.value if record is not None else "absent"
        if entry.delete_acked:
            if seen not in ("deleted", "absent") or stored not in ("deleted", "absent"):
                result.fail("acked_env_exists", env_id, f"delete acknowledged, but API {seen}, Redis {stored}", clock)
            continue
        if seen in ("deleted", "absent") or stored in ("deleted", "absent"):
            result.fail(
                "acked_env_exists", env_id, f"acknowledged ({entry.last_step}) but API {seen}, Redis {stored}", clock
            )
        elif seen != stored:
            result.fail("acked_env_exists", env_id, f"API says {seen}, Redis says {stored}", clock)
    unacked = sorted(set(records) - set(ledger.envs))
    if unacked:
        result.notes.append(
            f"{len(unacked)} Environment(s) in Redis the workload never saw acknowledged: "
            + ", ".join(f"{i}={records[i].state.value}" for i in unacked)
        )

    # no_transitional_state, no_failed_env (every record, acknowledged or not)
    for env_id, record in sorted(records.items()):
        result.checked["no_transitional_state"] += 1
        result.checked["no_failed_env"] += 1
        if record.state.value in TRANSITIONAL:
            result.fail(
                "no_transitional_state",
                env_id,
                f"{record.state.value} on {record.node} (rev {record.revision}, gen {record.generation}, "
                f"resume_intent {record.resume_intent is not None}, last_error {record.last_error!r})",
                clock,
            )
        if record.state.value == "failed":
            result.fail("no_failed_env", env_id, f"failed on {record.node}: {record.last_error!r}", clock)

    # one_execution, no_orphan_sandbox
    live_by_env: dict[str, list[tuple[str, SandboxInfo]]] = {}
    for node_name, listing in snap.sandboxes.items():
        if listing is None:
            result.fail("no_orphan_sandbox", node_name, "sandboxd inventory unavailable", clock)
            continue
        for info in listing:
            result.checked["no_orphan_sandbox"] += 1
            env_id = info.metadata.get(META_ENV, "")
            execution = info.metadata.get(META_EXECUTION, "")
            record = records.get(env_id)
            owned = (
                record is not None
                and record.state.value != "deleted"
                and record.node == node_name
                and record.execution_id == execution
            )
            if not owned:
                why = (
                    "no record"
                    if record is None
                    else f"record {record.state.value} on {record.node} execution {record.execution_id}"
                )
                result.fail(
                    "no_orphan_sandbox",
                    f"{node_name}/{info.sandbox_id}",
                    f"sandbox {info.state.value} of env {env_id or '?'} execution {execution or '?'}: {why}",
                    clock,
                )
            if info.state.value in LIVE_SANDBOX:
                live_by_env.setdefault(env_id, []).append((node_name, info))
    for env_id, record in sorted(records.items()):
        result.checked["one_execution"] += 1
        live = live_by_env.get(env_id, [])
        tags = [f"{n}/{i.sandbox_id}({i.state.value})" for n, i in live]
        if len(live) > 1:
            result.fail("one_execution", env_id, f"{len(live)} live sandboxes: {tags}", clock)
        elif record.state.value == "running":
            if not live:
                result.fail(
                    "one_execution",
                    env_id,
                    f"running on {record.node} ({record.execution_id}) without a sandbox",
                    clock,
                )
            elif live[0][0] != record.node or live[0][1].metadata.get(META_EXECUTION) != record.execution_id:
                result.fail(
                    "one_execution", env_id, f"record: {record.node}/{record.execution_id}, runtime: {tags}", clock
                )
        elif record.state.value in ("paused", "deleted") and live:
            result.fail("one_execution", env_id, f"{record.state.value} but live sandboxes {tags}", clock)

    # no_orphan_cgroup
    for node_name, names in snap.cgroups.items():
        listing = snap.sandboxes[node_name]
        # A sandbox's cgroup is named by its ID, or keeps its warm member's name once claimed (its native identity
        # says which); unclaimed warm members have `_warm-` cgroups too: at most as many as the pool reports.
        known = (
            {i.sandbox_id for i in listing} | {Path(i.native.cgroup_dir).name for i in listing if i.native}
            if listing is not None
            else None
        )
        members = snap.warm_members.get(node_name)
        unowned = [name for name in sorted(names) if known is not None and name not in known]
        pool_like = [name for name in unowned if name.startswith(WARM_CGROUP_PREFIX)]
        allowed = set(pool_like[: members or 0]) if members is not None else set()
        for name in sorted(names):
            result.checked["no_orphan_cgroup"] += 1
            if name in unowned and name not in allowed:
                detail = "cgroup of no sandbox in the inventory"
                if name in pool_like:
                    detail += f" (more `_warm-` cgroups than the {members} members the warm pool reports)"
                result.fail("no_orphan_cgroup", f"{node_name}/{name}", detail, clock)

    # no_orphan_checkpoint
    referenced = {r.checkpoint.location for r in records.values() if r.checkpoint and r.state.value != "deleted"}
    referenced_ids = {r.checkpoint.id for r in records.values() if r.checkpoint and r.state.value != "deleted"}
    for node_name, listing in snap.checkpoints.items():
        if listing is None:
            result.fail("no_orphan_checkpoint", node_name, "ListCheckpoints unavailable", clock)
            continue
        listed = {Path(c.location).name for c in listing.checkpoints} | {c.checkpoint_id for c in listing.checkpoints}
        root = cluster.nodes[node_name].sandboxd_state / "checkpoints"
        for leftover in sorted(p.name for p in root.iterdir()) if root.is_dir() else []:
            result.checked["no_orphan_checkpoint"] += 1
            if leftover not in listed:  # a capture's staging dir or a delete's rename, left behind
                result.fail(
                    "no_orphan_checkpoint", f"{node_name}/{leftover}", f"directory in {root} of no artifact", clock
                )
        for ckpt in listing.checkpoints:
            result.checked["no_orphan_checkpoint"] += 1
            if ckpt.location not in referenced and ckpt.checkpoint_id not in referenced_ids:
                retired = " (retired in Redis, not yet deleted)" if ckpt.checkpoint_id in snap.retired else ""
                result.fail(
                    "no_orphan_checkpoint",
                    f"{node_name}/{ckpt.checkpoint_id}",
                    f"checkpoint of sandbox {ckpt.source_sandbox_id} referenced by no live record{retired}",
                    clock,
                )

    # no_orphan_reservation, reservation_accounting, and a running Environment holds one
    for node_name, entries in sorted(snap.reservations.items()):  # reservation_accounting: node totals
        sums = [0, 0, 0]
        for env_id, held in sorted(entries.items()):
            result.checked["no_orphan_reservation"] += 1
            for i, value in enumerate(held.split()):
                sums[i] += int(value)
            record = records.get(env_id)
            holding = (
                record is not None
                and record.node == node_name
                and (record.state.value in HOLDING or (record.state.value == "failed" and record.restart_pending))
            )
            if not holding:
                why = "no record" if record is None else f"record {record.state.value} on {record.node}"
                result.fail("no_orphan_reservation", f"{node_name}:{env_id}", f"holds {held!r}: {why}", clock)
        result.checked["reservation_accounting"] += 1
        if tuple(sums) != snap.node_totals.get(node_name):
            result.fail(
                "reservation_accounting",
                node_name,
                f"node totals {snap.node_totals.get(node_name)} != sum of entries {tuple(sums)}",
                clock,
            )
    for env_id, record in sorted(records.items()):
        if record.state.value == "running" and record.node:
            result.checked["no_orphan_reservation"] += 1
            if env_id not in snap.reservations.get(record.node, {}):
                result.fail("no_orphan_reservation", env_id, f"running on {record.node} without a reservation", clock)

    # nodes_registered: each adxlet holds an unexpired session at the end (a node that never re-registers
    # leaves its Environments unserved while it looks alive)
    for node_name in cluster.nodes:
        result.checked["nodes_registered"] += 1
        expires = snap.sessions.get(node_name, 0.0)
        if expires < time.time():
            ago = f"{time.time() - expires:.0f}s ago" if expires else "never registered"
            result.fail("nodes_registered", node_name, f"session expired {ago} (adxlet process up)", clock)

    # journal_drained
    for node_name, node in cluster.nodes.items():
        result.checked["journal_drained"] += 1
        try:
            pending, how = await asyncio.to_thread(journal_pending, node.journal)
        except sqlite3.Error as exc:
            result.fail("journal_drained", node_name, f"journal {node.journal} unreadable: {exc}", clock)
            continue
        if pending:
            result.fail("journal_drained", node_name, f"{pending} pending row(s) ({how})", clock)
    return result, snap


async def read_back(ledger: Ledger, client: adx.AsyncClient, clock: Callable[[], float]) -> CheckResult:
    """acked_write_readable: every acknowledged file of every kept (not deleted, not failed) Environment."""
    result = CheckResult()
    overall = time.monotonic() + 150
    for env_id, entry in sorted(ledger.envs.items()):
        if entry.delete_acked or entry.failed:
            continue
        for path, content in sorted(entry.files.items()):
            result.checked["acked_write_readable"] += 1
            data: bytes | None = None
            last = "no time left for it"
            deadline = min(time.monotonic() + 45, overall)
            while data is None and time.monotonic() < deadline:
                try:
                    data = await asyncio.wait_for(_read(client, env_id, path), max(1.0, deadline - time.monotonic()))
                except NotFoundError as exc:
                    last = f"not found: {exc}"
                    break
                except (AdxError, OSError, TimeoutError) as exc:
                    last = f"{type(exc).__name__}: {exc}"
                    await asyncio.sleep(2.0)
            if data is None:
                result.fail(
                    "acked_write_readable", f"{env_id}:{path}", f"unreadable ({entry.last_step}): {last}", clock
                )
            elif data.decode(errors="replace") != content:
                result.fail("acked_write_readable", f"{env_id}:{path}", f"read {data[:80]!r}, wrote {content!r}", clock)
    return result


async def _read(client: adx.AsyncClient, env_id: str, path: str) -> bytes:
    env = await client.environments.get(env_id)
    return await env.files.read(path)


def state_histogram(records: dict[str, EnvironmentRecord]) -> dict[str, int]:
    return dict(sorted(Counter(r.state.value for r in records.values()).items()))
