"""The registry refuses what it cannot trust, changes nothing when it refuses, and migrates v1 correctly."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path

import pytest
from sbx_helpers import Daemon, DaemonFactory

from adx.sandboxd import CreateRequest, State, ref_of


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its content hash (dirs as 'dir'); daemon.lock is the store lock itself."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if rel == "daemon.lock":
            continue
        if path.is_symlink():
            out[rel] = "link:" + str(path.readlink())
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def v1_record(sandbox_id: str) -> dict[str, object]:
    now = time.time()
    return {
        "sandbox_id": sandbox_id,
        "generation": 1,
        "token": "t" * 43,
        "state": "running",
        "request_id": f"req-{sandbox_id}",
        "request_digest": "0" * 64,
        "argv": ["sleep", "1000"],
        "init_argv": ["sleep", "1000"],
        "env": {},
        "cwd": "/work",
        "network": "none",
        "resources": {"cpu_millis": 100, "memory_bytes": 64 << 20, "pids_max": 64, "disk_bytes": 0},
        "metadata": {},
        "created_at": now,
        "updated_at": now,
    }


def assert_refuses(d: Daemon, expect: str) -> None:
    before = snapshot(d.state_dir)
    code, output = d.run_to_exit()
    assert code != 0, output
    assert expect in output, output
    assert snapshot(d.state_dir) == before, "a refused start must not change the state dir"
    assert not d.socket.exists(), "a refused start must not bind the API"


async def _initialised(sandboxd: DaemonFactory) -> Daemon:
    d = sandboxd()
    async with d.client() as c:
        await c.delete(ref_of(await c.create(CreateRequest(request_id="x", argv=["true"]))))
    d.stop()
    return d


@pytest.mark.req("SBX-10", "SBX-14")
async def test_corrupt_record_refuses_start_and_changes_nothing(sandboxd: DaemonFactory) -> None:
    d = await _initialised(sandboxd)
    bad = d.state_dir / "sandboxes" / "sb-corrupt"
    bad.mkdir(mode=0o700)
    (bad / "record.json").write_text('{"format": 2, "owner": "nope", "record": {')
    assert_refuses(d, "sb-corrupt/record.json: corrupt or truncated JSON")


@pytest.mark.req("SBX-10", "SBX-14")
async def test_record_of_another_owner_refuses_start(sandboxd: DaemonFactory) -> None:
    d = await _initialised(sandboxd)
    bad = d.state_dir / "sandboxes" / "sb-foreign"
    bad.mkdir(mode=0o700)
    body = {"format": 2, "owner": str(uuid.uuid4()), "record": v1_record("sb-foreign")}
    (bad / "record.json").write_text(json.dumps(body))
    assert_refuses(d, "differs from the registry owner")


@pytest.mark.req("SBX-10", "SBX-14")
async def test_truncated_header_refuses_start(sandboxd: DaemonFactory) -> None:
    d = await _initialised(sandboxd)
    header = d.state_dir / "registry.json"
    header.write_bytes(header.read_bytes()[:9])
    assert_refuses(d, "registry.json: corrupt or truncated JSON")


@pytest.mark.req("SBX-10")
async def test_oversized_record_refuses_start(sandboxd: DaemonFactory) -> None:
    d = await _initialised(sandboxd)
    big = d.state_dir / "sandboxes" / "sb-big"
    big.mkdir(mode=0o700)
    (big / "record.json").write_bytes(b" " * (2 << 20))
    assert_refuses(d, "larger than the limit")


@pytest.mark.req("SBX-9")
async def test_v2_header_without_owner_marker_refuses_even_when_empty(sandboxd: DaemonFactory) -> None:
    d = await _initialised(sandboxd)
    (d.state_dir / "owner.json").unlink()
    assert_refuses(d, "v2 registry header without owner.json")
    assert not (d.state_dir / "owner.json").exists(), "markers are never fabricated"


@pytest.mark.req("SBX-9")
def test_v1_with_records_and_no_owner_marker_refuses(sandboxd: DaemonFactory) -> None:
    d = sandboxd(start=False)
    d.state_dir.mkdir(mode=0o700)
    v1 = {"version": 1, "sandboxes": {"legacy-1": v1_record("legacy-1")}}
    (d.state_dir / "sandboxes.json").write_text(json.dumps(v1))
    assert_refuses(d, "no owner.json marker")
    assert not (d.state_dir / "owner.json").exists()
    assert not (d.state_dir / "registry.json").exists()


@pytest.mark.req("SBX-9", "SBX-10", "SBX-14")
async def test_v1_with_owner_marker_migrates_then_never_falls_back(sandboxd: DaemonFactory) -> None:
    d = sandboxd(start=False)
    d.state_dir.mkdir(mode=0o700)
    owner = str(uuid.uuid4())
    (d.state_dir / "owner.json").write_text(json.dumps({"format": 1, "owner": owner}))
    v1 = {"version": 1, "sandboxes": {"legacy-1": v1_record("legacy-1")}}
    (d.state_dir / "sandboxes.json").write_text(json.dumps(v1))
    d.start()
    async with d.client() as c:
        assert (await c.health()).owner == owner
        [legacy] = await c.list()
        # The migrated record never had a native sandbox on this runtime: visible, reserved, not adopted.
        assert legacy.sandbox_id == "legacy-1" and legacy.state == State.FAILED
        assert (await c.resource()).reserved.memory_bytes == 64 << 20
    d.stop()
    envelope = json.loads((d.state_dir / "sandboxes/legacy-1/record.json").read_text())
    assert envelope["owner"] == owner and envelope["format"] == 2
    assert json.loads((d.state_dir / "registry.json").read_text()) == {"version": 2, "owner": owner}
    assert (d.state_dir / "sandboxes.json.migrated").exists()
    # An activated but incomplete tree never falls back to v1 (SBX-14).
    (d.state_dir / "sandboxes.json.migrated").rename(d.state_dir / "sandboxes.json")
    (d.state_dir / "sandboxes/legacy-1/record.json").write_text("{")
    assert_refuses(d, "corrupt or truncated JSON")


@pytest.mark.req("SBX-3")
async def test_second_daemon_on_the_same_state_dir_is_refused(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    second = Daemon(d.state_dir, d.cgroup_parent)
    second.socket = d.sock_dir / "other.sock"
    second.config_path = d.state_dir.parent / "second.toml"
    second.log_path = d.state_dir.parent / "second.log"
    second.write_config()
    try:
        code, output = second.run_to_exit()
        assert code != 0 and "daemon.lock" in output, output
        assert not second.socket.exists()
        async with d.client() as c:
            assert (await c.health()).ok  # the first daemon is unaffected
    finally:
        second.close()
