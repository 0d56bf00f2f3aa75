"""``/tmp`` and ``/var/tmp`` are kept by filesystem checkpoints like ``/work`` and ``/root`` (issue 13: a pause lost
every file an agent wrote in ``/tmp``, which was a tmpfs no checkpoint captured).

Each sandbox reads back, from inside, what earlier cycles wrote and writes its report into ``/work`` (which the
host reads from the sandbox's writable layer). The pause path is the node driver's: freeze, capture the frozen
sandbox, delete it, restore the artifact into a new sandbox ID.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sbx_helpers import Daemon, DaemonFactory, wait_until

from adx.sandboxd import CreateRequest, RestoreRequest, SandboxdClient, SandboxRef, ref_of

DIRS = ("/tmp", "/var/tmp", "/work", "/root")


def _cycle_script(cycle: int) -> str:
    """Report what earlier cycles left (content, or the error of a missing file), /tmp's listing and the modes,
    then write this cycle's files and signal readiness."""
    reads = " ".join(f"{d}/c{i}.txt" for i in range(1, cycle) for d in DIRS)
    check = f"cat {reads} 2>&1; " if reads else ""
    writes = " && ".join(f"echo 'cycle {cycle} in {d}' > {d}/c{cycle}.txt" for d in DIRS)
    return (
        f"{{ {check}echo modes $(stat -c %a /tmp /var/tmp); echo tmp $(ls -A /tmp); }} > /work/seen-{cycle}.tmp; "
        f"mv /work/seen-{cycle}.tmp /work/seen-{cycle}.txt; {writes} && touch /work/ready-{cycle}; sleep 1000"
    )


def _expected(cycle: int) -> str:
    kept = "".join(f"cycle {i} in {d}\n" for i in range(1, cycle) for d in DIRS)
    listing = " ".join(f"c{i}.txt" for i in range(1, cycle))
    return f"{kept}modes 1777 1777\ntmp {listing}\n".replace("tmp \n", "tmp\n")


async def _pause(c: SandboxdClient, ref: SandboxRef) -> tuple[str, str]:
    """What the node's driver does to pause: freeze, capture the frozen sandbox, then delete it."""
    await c.pause(ref)
    ck = await c.checkpoint(ref, leave_running=True)
    await c.delete(ref)
    return ck.location, ck.digest


def _upper(d: Daemon, sandbox_id: str) -> Path:
    return d.sandbox_dir(sandbox_id) / "upper"


@pytest.mark.req("SBX-5", "SBX-12")
async def test_tmp_var_tmp_work_root_survive_three_pause_restore_cycles(sandboxd: DaemonFactory) -> None:
    """SBX-5: every resume is a new sandbox ID restored from the checkpoint, never a restart of the old one.
    SBX-12: deleting a sandbox reclaims its storage, /tmp's files included (they live in its writable layer)."""
    d = sandboxd()
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="c1", argv=["/bin/sh", "-c", _cycle_script(1)]))
        ref = ref_of(created)
        seen_ids = [ref.sandbox_id]
        wait_until(lambda: (_upper(d, ref.sandbox_id) / "work/ready-1").exists())
        assert (_upper(d, ref.sandbox_id) / "work/seen-1.txt").read_text() == _expected(1)
        for cycle in range(2, 5):
            location, digest = await _pause(c, ref)
            previous = ref.sandbox_id
            # The deleted sandbox's layer, its /tmp included, is gone from the host.
            wait_until(lambda prev=previous: not _upper(d, prev).exists())  # type: ignore[misc]
            restored = await c.restore(
                RestoreRequest(
                    request_id=f"r{cycle}",
                    location=location,
                    digest=digest,
                    argv=["/bin/sh", "-c", _cycle_script(cycle)],
                )
            )
            ref = ref_of(restored)
            assert ref.sandbox_id not in seen_ids
            seen_ids.append(ref.sandbox_id)
            sid = ref.sandbox_id
            wait_until(lambda sid=sid, cycle=cycle: (_upper(d, sid) / f"work/ready-{cycle}").exists())  # type: ignore[misc]
            assert (_upper(d, sid) / f"work/seen-{cycle}.txt").read_text() == _expected(cycle)
            await c.delete_checkpoint(location, digest)
        await c.delete(ref)
        wait_until(lambda: not _upper(d, ref.sandbox_id).exists())


BIG = (
    "head -c 67108864 /dev/urandom > /tmp/big && sha256sum /tmp/big > /work/sum.tmp && mv /work/sum.tmp /work/sum"
    " && sleep 1000"
)
FORK_A = (
    "sha256sum /tmp/big > /work/sum; echo a > /tmp/only-a; head -c 4096 /dev/zero > /tmp/big;"
    " touch /work/done; sleep 1000"
)
FORK_B = "sha256sum /tmp/big > /work/sum; ls -A /tmp > /work/ls; touch /work/done; sleep 1000"


@pytest.mark.req("SBX-5")
async def test_large_tmp_is_captured_and_each_restore_of_one_checkpoint_gets_its_own_copy(
    sandboxd: DaemonFactory,
) -> None:
    """64 MiB of /tmp through a checkpoint; two restores of the same artifact into new IDs (SBX-5) are
    independent: what one writes or overwrites in /tmp is not seen by the other."""
    d = sandboxd(defaults={"memory_bytes": 256 << 20})
    async with d.client() as c:
        src = await c.create(CreateRequest(request_id="big", argv=["/bin/sh", "-c", BIG]))
        sid = src.sandbox.sandbox_id
        wait_until(lambda: (_upper(d, sid) / "work/sum").exists(), timeout=30)
        original = (_upper(d, sid) / "work/sum").read_text().split()[0]
        location, digest = await _pause(c, ref_of(src))
        a = await c.restore(
            RestoreRequest(request_id="a", location=location, digest=digest, argv=["/bin/sh", "-c", FORK_A])
        )
        aid = a.sandbox.sandbox_id
        wait_until(lambda: (_upper(d, aid) / "work/done").exists(), timeout=30)
        b = await c.restore(
            RestoreRequest(request_id="b", location=location, digest=digest, argv=["/bin/sh", "-c", FORK_B])
        )
        bid = b.sandbox.sandbox_id
        wait_until(lambda: (_upper(d, bid) / "work/done").exists(), timeout=30)
        assert len({sid, aid, bid}) == 3
        assert (_upper(d, aid) / "work/sum").read_text().split()[0] == original
        assert (_upper(d, bid) / "work/sum").read_text().split()[0] == original  # A's overwrite is A's alone
        assert (_upper(d, bid) / "work/ls").read_text().split() == ["big"]  # not A's only-a, nothing of the host
        assert (_upper(d, aid) / "tmp/only-a").read_text() == "a\n"
        await c.delete(ref_of(a))
        await c.delete(ref_of(b))
        await c.delete_checkpoint(location, digest)
    assert "tmp_bytes" not in d.log()  # no warning when the key is not set


def test_an_old_tmp_bytes_setting_loads_but_is_reported_as_bounding_nothing(sandboxd: DaemonFactory) -> None:
    """Older configs keep loading; the daemon says the key no longer limits /tmp instead of pretending it does."""
    d = sandboxd(defaults={"tmp_bytes": 16 << 20})
    assert "defaults.tmp_bytes is set but bounds nothing" in d.log()
