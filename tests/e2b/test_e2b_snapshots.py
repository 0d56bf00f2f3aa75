"""Snapshots and fork through the real ``e2b`` SDK against ``adx up`` (docs/e2b.md "Snapshots and fork"): each
snapshot is a real ADX filesystem checkpoint captured while its sandbox goes on, kept apart from the sandbox (it
survives the sandbox's deletion), restored by the first start of a sandbox made from it, and reclaimed (its
artifact deleted from the node) once the snapshot is deleted."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest
from e2b import AsyncSandbox, Sandbox
from e2b.exceptions import NotFoundException, SandboxException

if TYPE_CHECKING:
    from conftest import Up

pytestmark = pytest.mark.slow


def artifacts(up: Up) -> set[str]:
    """The checkpoint artifacts on adx up's node (sandboxd's local checkpoint root)."""
    root = up.state / "sandboxd" / "data" / "checkpoints"
    return {p.name for p in root.iterdir()} if root.exists() else set()


def wait_for(check: object, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.25)


@pytest.mark.req("ENV-3", "CRD-9")
def test_snapshot_keeps_files_before_it_and_outlives_its_source(adx_up: Up) -> None:
    """Files written before the snapshot are in a sandbox made from it, files written after are not; the source
    runs on (its processes too); the snapshot outlives the source's deletion (CRD-9: an artifact something
    references is kept) and serves more than one create; deleting it reclaims its artifact."""
    opts = adx_up.opts()
    before = artifacts(adx_up)
    source = Sandbox.create(**opts)
    made: list[Sandbox] = []
    try:
        source.files.write("before.txt", "written before")
        source.commands.run("mkdir -p /home/user/dir && echo nested > /home/user/dir/n.txt")
        sleeper = source.commands.run("sleep 600", background=True)
        snapshot = source.create_snapshot(name="sync-test-snapshot")
        assert snapshot.snapshot_id.startswith("snap-") and snapshot.names == ["sync-test-snapshot"]
        # The source goes on: running, its background process alive, still writable.
        assert source.is_running()
        assert any(p.pid == sleeper.pid for p in source.commands.list())
        source.files.write("after.txt", "written after")
        (new_artifact,) = artifacts(adx_up) - before  # a real checkpoint on the node

        listed = Sandbox.list_snapshots(**opts).next_items()
        assert snapshot.snapshot_id in [s.snapshot_id for s in listed]
        assert [s.snapshot_id for s in source.list_snapshots().next_items()] == [snapshot.snapshot_id]
        assert Sandbox.list_snapshots(name="sync-test-snapshot", **opts).next_items()[0].snapshot_id == (
            snapshot.snapshot_id
        )

        copy = Sandbox.create(snapshot.snapshot_id, **opts)
        made.append(copy)
        assert copy.sandbox_id != source.sandbox_id
        assert copy.files.read("before.txt") == "written before"
        assert copy.files.read("/home/user/dir/n.txt") == "nested\n"
        assert not copy.files.exists("after.txt")
        assert copy.commands.run("whoami").stdout == "user\n"
        copy.files.write("own.txt", "x")  # a sandbox of its own: the source does not see it
        assert not source.files.exists("own.txt")

        source.kill()
        assert new_artifact in artifacts(adx_up)  # the snapshot holds it: the source's deletion keeps it
        by_name = Sandbox.create("sync-test-snapshot", **opts)  # by its name, after its source is gone
        made.append(by_name)
        assert by_name.files.read("before.txt") == "written before"

        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **opts) is True
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **opts) is False  # E2B's not found
        assert snapshot.snapshot_id not in [s.snapshot_id for s in Sandbox.list_snapshots(**opts).next_items()]
        with pytest.raises(SandboxException, match=r"404: snapshot .* not found"):
            Sandbox.create(snapshot.snapshot_id, **opts)
        wait_for(lambda: new_artifact not in artifacts(adx_up))  # reclaimed by its node
        assert made[0].files.read("before.txt") == "written before"  # sandboxes made from it do not need it
    finally:
        for sandbox in [source, *made]:
            sandbox.kill()


def test_snapshot_errors_are_e2bs(adx_up: Up) -> None:
    """A missing sandbox is E2B's not-found, another tenant's snapshot is invisible, a memory snapshot is refused
    (ADX checkpoints filesystems) and the source keeps running."""
    opts = adx_up.opts()
    with pytest.raises(NotFoundException):
        Sandbox.create_snapshot("env-aaaaaaaaaaaaaaaaaaaaaaaaaa", **opts)
    source = Sandbox.create(**opts)
    try:
        with pytest.raises(SandboxException, match="memory snapshots are not supported"):
            source.create_snapshot(mode="full")
        snapshot = source.create_snapshot()
        assert snapshot.names == []
        other = adx_up.opts(adx_up.other_key)
        assert snapshot.snapshot_id not in [s.snapshot_id for s in Sandbox.list_snapshots(**other).next_items()]
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **other) is False
        with pytest.raises(SandboxException, match=r"404: snapshot .* not found"):
            Sandbox.create(snapshot.snapshot_id, **other)
        assert Sandbox.delete_snapshot("snap-aaaaaaaaaaaaaaaaaaaaaaaaaa", **opts) is False
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **opts) is True
        assert source.commands.run("echo on").stdout == "on\n"
    finally:
        source.kill()


def test_fork_sync(adx_up: Up) -> None:
    """``fork(count=2)``: two new sandboxes with the source's files, the source untouched; the snapshot the fork
    took is deleted once both started (nothing is left to reclaim later)."""
    opts = adx_up.opts()
    source = Sandbox.create(envs={"FROM": "source"}, **opts)
    forks: list[Sandbox] = []
    try:
        source.files.write("state.txt", "forked state")
        results = source.fork(count=2, timeout=120)
        forks = [r for r in results if isinstance(r, Sandbox)]
        assert len(forks) == 2, results
        assert len({f.sandbox_id for f in forks} | {source.sandbox_id}) == 3
        for fork in forks:
            assert fork.files.read("state.txt") == "forked state"
            assert fork.commands.run("echo $FROM").stdout == "source\n"  # the source's spec
            info = fork.get_info()
            assert 110 <= (info.end_at - info.started_at).total_seconds() <= 130
        forks[0].files.write("state.txt", "changed")
        assert source.files.read("state.txt") == "forked state"
        assert source.is_running()
        assert source.list_snapshots().next_items() == []
    finally:
        for sandbox in [source, *forks]:
            sandbox.kill()


async def test_snapshots_and_fork_async(adx_up: Up) -> None:
    opts = adx_up.opts()
    source = await AsyncSandbox.create(**opts)
    made: list[AsyncSandbox] = []
    try:
        await source.files.write("before.txt", "async before")
        snapshot = await source.create_snapshot(mode="filesystem")
        await source.files.write("after.txt", "async after")
        assert await source.is_running()
        paginator = AsyncSandbox.list_snapshots(sandbox_id=source.sandbox_id, **opts)
        assert [s.snapshot_id for s in await paginator.next_items()] == [snapshot.snapshot_id]

        copy = await AsyncSandbox.create(snapshot.snapshot_id, **opts)
        made.append(copy)
        assert await copy.files.read("before.txt") == "async before"
        assert not await copy.files.exists("after.txt")

        (fork,) = await source.fork(count=1)
        assert isinstance(fork, AsyncSandbox), fork
        made.append(fork)
        assert await fork.files.read("after.txt") == "async after"

        assert await AsyncSandbox.delete_snapshot(snapshot.snapshot_id, **opts) is True
        assert await AsyncSandbox.delete_snapshot(snapshot.snapshot_id, **opts) is False
        with pytest.raises(NotFoundException):
            await AsyncSandbox.create_snapshot("env-aaaaaaaaaaaaaaaaaaaaaaaaaa", **opts)
    finally:
        for sandbox in [source, *made]:
            await sandbox.kill()
