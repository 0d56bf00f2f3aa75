"""The SQLite degradation journal (JRN-1..8, NOD-17, ENV-6) on real parts: a Coordinator process held by
SIGSTOP, a real adxlet process (SIGKILLed meanwhile), real sandboxd and sandboxes, real Redis."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from process_cluster import ProcessCluster, record_of, wait_for
from test_node_agent import Api

from adx.errors import PublicationPendingError
from adx.model import EnvironmentSpec, EnvironmentState
from adx.node._journal import DegradationJournal, JournalCorruptError, NewResult, spec_digest

S = EnvironmentState


def journal_rows(path: Path) -> list[tuple[str, str, int]]:
    """(env_id, state, revision) of every pending entry, in journal order (read with plain sqlite3)."""
    if not path.exists():
        return []
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [
            (env_id, state, revision)
            for env_id, state, revision in db.execute(
                "SELECT env_id, state, revision FROM pending_results ORDER BY seq"
            )
        ]
    finally:
        db.close()


async def sandbox_ids(cluster: ProcessCluster, node: str = "n1") -> set[str]:
    return {s.sandbox_id for s in await cluster.nodes[node].sandboxd.client().list()}


def api_of(cluster: ProcessCluster) -> Api:
    """The Coordinator's API-facing calls, made as the API server makes them."""
    target = type("Target", (), {"target": cluster.coordinator_address})()
    view = type("View", (), {"cluster": target, "api_credentials": lambda self: cluster.api_credentials()})
    return Api(view())


def database_files(path: Path) -> list[str]:
    """The journal's database and its WAL/shm companions that exist."""
    names = (path.name, f"{path.name}-wal", f"{path.name}-shm", f"{path.name}.pending")
    return [name for name in names if (path.parent / name).exists()]


def mount(*argv: str) -> None:
    subprocess.run(list(argv), check=True)


async def node_registered(api: Api, within: float = 60) -> None:
    async def ready() -> bool:
        try:
            await api.create()
        except Exception:
            return False
        return True

    await wait_for(ready, within, "the node to register and take an Environment", interval=0.3)


@pytest.mark.req("JRN-1", "JRN-2", "JRN-3", "JRN-4", "JRN-5", "JRN-6", "JRN-7", "NOD-17", "ENV-6", "NOD-18")
async def test_coordinator_sigstopped_idle_delete_and_pause_resume_journal_in_order_and_replay(process_cluster) -> None:
    """Seed acceptance: "Coordinator paused during an idle delete" and "adxlet restarted while the Coordinator is
    away waits for it and keeps running instances", plus pause-then-resume replayed in order.

    Coordinator held by SIGSTOP: an idle delete and a pause followed by a resume go to SQLite in order; Redis is
    unchanged; the pause answers publication pending. The adxlet SIGKILLed meanwhile restarts, waits for the
    catalog and touches no sandbox. SIGCONT: the entries replay in order to zero pending and the file is gone.
    """
    cluster: ProcessCluster = process_cluster()
    journal = cluster.nodes["n1"].journal
    api = api_of(cluster)
    nodes = cluster.node_clients(rpc_timeout=30)
    try:
        await node_registered(api)
        idle = await api.create(lifecycle={"idleTimeoutSeconds": 3})
        kept = await api.create()
        idle_running = await api.wait_state(idle.id, S.RUNNING)
        kept_running = await api.wait_state(kept.id, S.RUNNING)
        status, _, body = await cluster.run("n1", kept.id, ["sh", "-c", "echo journal-data > /work/f"])
        assert status == 200, body
        assert not journal.exists()  # JRN-1: nothing pending, no database file
        before = {env_id: await cluster.redis_record(env_id) for env_id in (idle.id, kept.id)}

        cluster.coordinator.freeze()
        # The idle delete completes on the node and is journaled: DELETING then DELETED.
        await wait_for(
            lambda: [r for r in journal_rows(journal) if r[0] == idle.id and r[1] == "deleted"],
            30,
            "the idle delete journaled",
        )
        assert idle_running.execution_id not in await sandbox_ids(cluster)

        # A pause straight to the owning node (the API's route cache path, CRD-1): done, not published.
        with pytest.raises(PublicationPendingError) as pending:
            await nodes.pause(cluster.nodes["n1"].listen, kept_running, wait_seconds=30)
        assert "cluster publication pending" in str(pending.value)
        assert kept_running.execution_id not in await sandbox_ids(cluster)

        # Demand at the Relay resumes it on this node (the cluster still routes here) and is served (JRN-4).
        status, stdout, body = await cluster.run("n1", kept.id, ["cat", "/work/f"])
        assert (status, stdout) == (200, "journal-data\n"), body

        rows = journal_rows(journal)
        base_idle, base_kept = idle_running.revision, kept_running.revision
        assert rows == [
            (idle.id, "deleting", base_idle + 1),
            (idle.id, "deleted", base_idle + 2),
            (kept.id, "pausing", base_kept + 1),
            (kept.id, "paused", base_kept + 2),
            (kept.id, "resuming", base_kept + 3),
            (kept.id, "running", base_kept + 4),
        ]
        # Redis is unchanged: nothing claimed a global commit.
        assert {env_id: await cluster.redis_record(env_id) for env_id in (idle.id, kept.id)} == before

        # The adxlet SIGKILLed while the Coordinator is away: its successor waits and touches no sandbox.
        sandboxes = await sandbox_ids(cluster)
        cluster.nodes["n1"].adxlet.kill()
        cluster.nodes["n1"].adxlet.start()
        await asyncio.sleep(5)
        assert cluster.nodes["n1"].adxlet.alive()
        assert await sandbox_ids(cluster) == sandboxes
        assert journal_rows(journal) == rows  # JRN-7: never read as empty, never rewritten

        cluster.coordinator.thaw()
        # The marker goes last, one directory fsync after the database: waited for, not raced (it failed 2 runs
        # of 8 under load with only the marker left).
        await wait_for(lambda: database_files(journal) == [], 60, "the journal to replay and be removed")
        deleted = record_of(await cluster.redis_record(idle.id))
        assert deleted is None or deleted.state is S.DELETED
        resumed = await api.wait_state(kept.id, S.RUNNING)
        assert resumed.revision == base_kept + 4
        assert resumed.generation == kept_running.generation
        assert resumed.execution_id not in (None, kept_running.execution_id)
        assert resumed.execution_id in await sandbox_ids(cluster)
        status, stdout, body = await cluster.run_when_served("n1", kept.id, ["cat", "/work/f"])
        assert (status, stdout) == (200, "journal-data\n"), body
    finally:
        await nodes.close()
        await api.close()


def _result(env_id: str, base_revision: int, state: EnvironmentState) -> NewResult:
    spec = EnvironmentSpec.model_validate({"resources": {"cpuMillis": 100, "memoryBytes": 2**27}})
    return NewResult(
        env_id=env_id,
        generation=1,
        base_revision=base_revision,
        base_state=S.RUNNING,
        base_execution_id="exe-1",
        state=state,
        execution_id=None,
        changes={"state": state.value},
        release_reservation=False,
        spec_digest=spec_digest(spec),
    )


@pytest.mark.req("JRN-1", "JRN-3")
async def test_journal_is_created_lazily_keeps_order_dedups_and_is_removed_when_empty(tmp_path: Path) -> None:
    path = tmp_path / "state" / "journal.sqlite3"
    journal = DegradationJournal(path)
    assert journal.open_existing() == [] and not path.exists()
    first = await journal.append(_result("env-a", 3, S.PAUSING))
    again = await journal.append(_result("env-a", 3, S.PAUSING))  # the same result twice is stored once
    second = await journal.append(_result("env-a", 4, S.PAUSED))
    assert again.seq == first.seq and second.seq > first.seq
    assert path.exists() and (path.stat().st_mode & 0o777) == 0o600
    assert (await journal.pending("env-a")) == [first, second]
    db = sqlite3.connect(str(path))
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.close()
    # A new process reads the same entries back in order.
    journal.close()
    reopened = DegradationJournal(path)
    assert [e.seq for e in reopened.open_existing()] == [first.seq, second.seq]
    assert await reopened.remove([first.seq]) == 1 and path.exists()
    assert await reopened.remove([second.seq]) == 0
    assert database_files(path) == []  # the database, its WAL and its marker are all gone


@pytest.mark.req("JRN-8")
async def test_a_journal_deleted_while_it_held_results_is_reported_lost_an_emptied_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = DegradationJournal(path)
    entry = await journal.append(_result("env-a", 3, S.PAUSING))
    journal.close()
    for name in database_files(path):
        if not name.endswith(".pending"):
            (tmp_path / name).unlink()  # an operator removes the database, not knowing what it held
    lost = DegradationJournal(path)
    assert lost.open_existing() == [] and lost.lost
    assert database_files(path) == []  # said once: the next start is a normal one
    assert not DegradationJournal(path).lost
    emptied = DegradationJournal(path)
    entry = await emptied.append(_result("env-b", 3, S.PAUSING))
    await emptied.remove([entry.seq])
    again = DegradationJournal(path)
    assert again.open_existing() == [] and not again.lost


@pytest.mark.req("JRN-7")
@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign-schema", "revision-gap"])
async def test_a_corrupt_journal_is_refused_naming_the_file_never_read_as_empty(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = DegradationJournal(path)
    await journal.append(_result("env-a", 3, S.PAUSING))
    await journal.append(_result("env-a", 4, S.PAUSED))
    journal.close()
    if damage == "garbage":
        path.write_bytes(b"this is not a database" * 100)
    elif damage == "truncated":
        data = path.read_bytes()
        for name in database_files(path)[1:]:
            (path.parent / name).unlink()
        path.write_bytes(data[:1500])
    elif damage == "revision-gap":  # a row whose commit would not produce its stored revision
        db = sqlite3.connect(str(path))
        db.execute("UPDATE pending_results SET revision = revision + 1 WHERE base_revision = 4")
        db.commit()
        db.close()
    else:
        path.unlink()
        db = sqlite3.connect(str(path))
        db.execute("CREATE TABLE other (x)")
        db.commit()
        db.close()
    with pytest.raises(JournalCorruptError) as refused:
        DegradationJournal(path).open_existing()
    assert str(path) in str(refused.value) and refused.value.field == "degradation_journal"
    assert path.exists()  # left for the operator, never replaced by an empty one


@pytest.mark.req("JRN-7")
async def test_the_adxlet_refuses_to_start_on_a_corrupt_journal(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    path.write_bytes(b"\x00garbage" * 512)
    config = tmp_path / "node.toml"
    config.write_text(
        f'name = "n1"\nstate_dir = "{tmp_path / "state"}"\ndegradation_journal = "{path}"\n'
        f'runtime = {{ socket = "{tmp_path / "no.sock"}" }}\n'
    )
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "adx", "node", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert str(path) in done.stderr + done.stdout and "degradation_journal" in done.stderr + done.stdout


@pytest.mark.req("JRN-2")
async def test_a_journal_directory_that_refuses_writes_never_yields_journaled(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    mount("mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(directory))
    try:
        journal = DegradationJournal(directory / "journal.sqlite3")
        from adx.errors import UnavailableError

        with pytest.raises(UnavailableError):
            await journal.append(_result("env-a", 3, S.PAUSING))
        assert journal.open_existing() == [] and not (directory / "journal.sqlite3").exists()
    finally:
        mount("umount", str(directory))
