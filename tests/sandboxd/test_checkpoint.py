"""Filesystem checkpoints: capture the upper layer, delete, restore (locally and on a second sandboxd)."""
# ruff: noqa: ASYNC240 - the tests inspect host files between awaits; a blocking stat in a test is harmless

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sbx_helpers import DaemonFactory, wait_until

from adx.errors import ConflictError, InvalidInputError
from adx.sandboxd import CreateRequest, RestoreRequest, State, ref_of

WRITER = (
    "mkdir -p /work/data /opt/app && echo one > /work/data/a.txt && echo two > /opt/app/b.txt"
    " && rm -f /etc/hostname && mkdir -p /var/x && echo ready > /work/ready && sleep 1000"
)
CHECKER = (
    "{ cat /work/data/a.txt /opt/app/b.txt; test -e /etc/hostname && echo hostname-back; } > /work/seen.tmp;"
    " mv /work/seen.tmp /work/seen.txt; sleep 1000"
)


@pytest.mark.req("ENV-2", "SBX-5")
async def test_checkpoint_delete_restore_here_and_on_a_second_sandboxd(sandboxd: DaemonFactory, tmp_path: Path) -> None:
    shared = tmp_path / "shared-artifacts"
    d1 = sandboxd("d1", checkpoint_dirs={"shared": str(shared)})
    d2 = sandboxd("d2", checkpoint_dirs={"shared": str(shared)})
    async with d1.client() as c1, d2.client() as c2:
        src = await c1.create(CreateRequest(request_id="src", argv=["/bin/sh", "-c", WRITER], metadata={"k": "v"}))
        sid = src.sandbox.sandbox_id
        wait_until(lambda: (d1.sandbox_dir(sid) / "upper/work/ready").exists())
        assert (await c1.stats(ref_of(src))).disk_bytes >= 3 * 4096  # the writable layer's usage is reported
        ck = await c1.checkpoint(ref_of(src), storage="shared")
        assert ck.kind == "filesystem" and Path(ck.location).parent == shared
        manifest = json.loads((Path(ck.location) / "manifest.json").read_text())
        assert manifest["source"]["sandbox_id"] == sid and manifest["layer"]["sha256"] == ck.layer_sha256
        assert (await c1.get(ref_of(src))).state == State.RUNNING  # thawed after capture
        await c1.delete(ref_of(src))

        for client, daemon, name in ((c1, d1, "local"), (c2, d2, "second")):
            restored = await client.restore(
                RestoreRequest(
                    request_id=f"restore-{name}",
                    location=ck.location,
                    digest=ck.digest,
                    argv=["/bin/sh", "-c", CHECKER],
                )
            )
            rid = restored.sandbox.sandbox_id
            assert rid != sid and restored.sandbox.restored_from == ck.checkpoint_id
            assert restored.sandbox.metadata == {"k": "v"}
            seen = daemon.sandbox_dir(rid) / "upper/work/seen.txt"
            wait_until(seen.exists)
            # Files written before the checkpoint are there; the deletion (a whiteout) survived too.
            assert seen.read_text() == "one\ntwo\n"
            await client.delete(ref_of(restored))

        # Artifacts are removed only by their exact digest; removal is idempotent.
        with pytest.raises(ConflictError):
            await c2.delete_checkpoint(ck.location, "0" * 64)
        await c2.delete_checkpoint(ck.location, ck.digest)
        assert not Path(ck.location).exists() and list(shared.iterdir()) == []
        await c1.delete_checkpoint(ck.location, ck.digest)


@pytest.mark.req("ENV-2")
async def test_tampered_artifact_or_wrong_digest_is_refused(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        src = await c.create(CreateRequest(request_id="src", argv=["/bin/sh", "-c", "echo x > /work/x; sleep 1000"]))
        wait_until(lambda: (d.sandbox_dir(src.sandbox.sandbox_id) / "upper/work/x").exists())
        ck = await c.checkpoint(ref_of(src))
        await c.delete(ref_of(src))
        before = {s.sandbox_id for s in await c.list()}

        with pytest.raises(ConflictError, match="manifest digest"):
            await c.restore(RestoreRequest(request_id="r1", location=ck.location, digest="0" * 64))
        with pytest.raises(InvalidInputError):
            await c.restore(RestoreRequest(request_id="r2", location="/etc", digest=ck.digest))

        layer = next(Path(ck.location).glob("layer.tar.*"))
        data = bytearray(layer.read_bytes())
        data[len(data) // 2] ^= 0xFF
        layer.write_bytes(bytes(data))
        with pytest.raises(ConflictError, match="layer sha256"):
            await c.restore(RestoreRequest(request_id="r3", location=ck.location, digest=ck.digest))
        # A refused restore leaves nothing running and nothing reserved.
        assert {s.sandbox_id for s in await c.list()} == before
        assert (await c.resource()).reserved.memory_bytes == 0


@pytest.mark.req("NOD-15", "SBX-10")
async def test_each_daemon_lists_and_sweeps_only_its_own_artifacts(sandboxd: DaemonFactory, tmp_path: Path) -> None:
    """Two daemons share one artifact root. A capture appears whole (renamed into place) and each daemon lists
    only the whole artifacts it captured. After a SIGKILL, a restarted daemon removes what an interrupted
    capture of its own or an interrupted delete left, and never another daemon's capture in flight."""
    shared = tmp_path / "shared-artifacts"
    d1 = sandboxd("d1", checkpoint_dirs={"shared": str(shared)})
    d2 = sandboxd("d2", checkpoint_dirs={"shared": str(shared)})
    owner1, owner2 = (json.loads((d.state_dir / "owner.json").read_text())["owner"] for d in (d1, d2))
    argv = ["/bin/sh", "-c", "echo x > /work/x; sleep 1000"]
    async with d1.client() as c1, d2.client() as c2:
        one = await c1.create(CreateRequest(request_id="one", argv=argv))
        two = await c2.create(CreateRequest(request_id="two", argv=argv))
        for daemon, created in ((d1, one), (d2, two)):
            wait_until(lambda d=daemon, c=created: (d.sandbox_dir(c.sandbox.sandbox_id) / "upper/work/x").exists())
        mine = await c1.checkpoint(ref_of(one), storage="shared")
        mine_local = await c1.checkpoint(ref_of(one))
        theirs = await c2.checkpoint(ref_of(two), storage="shared")
        assert sorted(p.name for p in shared.iterdir()) == sorted([mine.checkpoint_id, theirs.checkpoint_id])

        listed = (await c1.list_checkpoints("shared")).checkpoints
        assert [(c.checkpoint_id, c.digest, c.location) for c in listed] == [
            (mine.checkpoint_id, mine.digest, mine.location)
        ]
        assert listed[0].size_bytes == mine.size_bytes and listed[0].source_sandbox_id == one.sandbox.sandbox_id
        assert [c.checkpoint_id for c in (await c1.list_checkpoints()).checkpoints] == [mine_local.checkpoint_id]
        assert [c.checkpoint_id for c in (await c2.list_checkpoints("shared")).checkpoints] == [theirs.checkpoint_id]
        with pytest.raises(InvalidInputError, match="storage"):
            await c1.list_checkpoints("nowhere")

    local = Path(mine_local.location).parent
    leftovers = {
        shared / f".capturing-{owner1}-ckp-crashed": False,  # d1's interrupted capture: removed
        shared / f".capturing-{owner2}-ckp-inflight": True,  # d2's capture in flight: kept
        shared / ".deleting-ckp-halfway": False,
        local / f".capturing-{owner1}-ckp-local": False,
        local / ".deleting-ckp-local": False,
    }
    for path in leftovers:
        path.mkdir()
        (path / "layer.tar.zst").write_bytes(b"partial")
    d1.kill()
    d1.start()
    assert {path: path.exists() for path in leftovers} == leftovers
    for whole in (mine, mine_local, theirs):
        assert (Path(whole.location) / "manifest.json").exists()
