"""User namespaces (issue 13): a sandbox's root is an unprivileged host ID slice of its own, the image's files
appear root's inside, no host path shows in its mount table, and checkpoints keep ownership."""
# ruff: noqa: ASYNC221 - the tests inspect host files and run host tools between awaits (harmless here)

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError
from sbx_helpers import DaemonFactory, wait_until

from adx.errors import ConflictError
from adx.sandboxd import CreateRequest, RestoreRequest, ref_of
from adx.sandboxd._config import SandboxdConfig
from adx.sandboxd._userns import IDS_PER_SANDBOX, allocate

PROBE = r"""
import json, os
out = {"uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid()}
out["uid_map"] = open("/proc/self/uid_map").read().split()
out["gid_map"] = open("/proc/self/gid_map").read().split()
paths = ("/", "/etc/passwd", "/usr/bin/env", "/opt/hostdir/hostfile", "/tmp")
out["owners"] = {p: [os.stat(p).st_uid, os.stat(p).st_gid] for p in paths if os.path.exists(p)}
out["mounts"] = open("/proc/mounts").read()
out["mountinfo"] = open("/proc/self/mountinfo").read()
def attempt(path):
    try:
        with open(path, "a") as fh:
            fh.write("x")
        return "written"
    except OSError as exc:
        return exc.strerror
paths = ("/opt/hostdir/hostfile", "/usr/adx-probe", "/proc/sys/kernel/core_pattern", "/work/own.txt", "/tmp/own.txt")
out["write"] = {p: attempt(p) for p in paths}
os.makedirs("/home/user", exist_ok=True)
open("/home/user/u.txt", "w").write("user's\n")
os.chown("/home/user/u.txt", 1000, 1000)
os.chown("/home/user", 1000, 1000)
open("/work/ready.tmp", "w").write(json.dumps(out))
os.rename("/work/ready.tmp", "/work/ready")  # whole when it appears: the test reads it as soon as it exists
"""

#: The probe, then stay up (the test inspects the running sandbox from the host).
PROBE_ARGV = ["/bin/sh", "-c", 'python3 -c "$PROBE" && exec sleep 1000']


def _host_dir(tmp_path: Path) -> Path:
    """A host dir with a root-owned file: the sandbox reaches it through a read-only bind."""
    host = tmp_path / "hostdir"
    host.mkdir()
    (host / "hostfile").write_text("host's\n")
    host.chmod(0o777)  # world-writable dir: only the mount and the IDs keep the sandbox out
    (host / "hostfile").chmod(0o666)
    return host


def _status_ids(pid: int) -> tuple[int, int]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    uid = next(line.split()[1:] for line in lines if line.startswith("Uid:"))
    gid = next(line.split()[1:] for line in lines if line.startswith("Gid:"))
    return int(uid[0]), int(gid[0])


@pytest.mark.req("SEC-3")
async def test_root_inside_is_an_unprivileged_host_id_that_cannot_write_host_paths(
    sandboxd: DaemonFactory, tmp_path: Path
) -> None:
    host = _host_dir(tmp_path)
    d = sandboxd(ro_binds={"/opt/hostdir": str(host)})
    async with d.client() as c:
        health = await c.health()
        assert health.user_namespace is True and health.user_namespace_note is None
        created = await c.create(CreateRequest(request_id="u1", argv=PROBE_ARGV, env={"PROBE": PROBE}))
        info = created.sandbox
        base = info.id_base
        assert base is not None and base >= 65536
        sid = info.sandbox_id
        upper = d.sandbox_dir(sid) / "upper"
        wait_until(lambda: (upper / "work/ready").exists())
        out = json.loads((upper / "work/ready").read_text())

        # Inside: root, and the map shows the slice.
        assert (out["uid"], out["gid"], out["euid"]) == (0, 0, 0)
        assert out["uid_map"] == ["0", str(base), str(IDS_PER_SANDBOX)]
        assert out["gid_map"] == ["0", str(base), str(IDS_PER_SANDBOX)]
        # From the host: every process of the sandbox runs as the mapped IDs, none as 0.
        procs = d.settled_procs(sid, count=1)  # the probe (python3) has exited: sh exec'd sleep, PID 1
        assert procs and all(_status_ids(pid) == (base, base) for pid in procs)
        # The image's files (lower layer, host binds such as /usr) and the sandbox's root dir appear root's.
        for path in ("/", "/etc/passwd", "/usr/bin/env", "/opt/hostdir/hostfile"):
            assert out["owners"][path] == [0, 0], path
        # Host paths are not writable; the sandbox's own files are.
        assert out["write"]["/opt/hostdir/hostfile"] == "Read-only file system"
        assert out["write"]["/usr/adx-probe"] == "Read-only file system"
        assert out["write"]["/proc/sys/kernel/core_pattern"] in ("Read-only file system", "Permission denied")
        assert out["write"]["/work/own.txt"] == "written" and out["write"]["/tmp/own.txt"] == "written"
        assert (host / "hostfile").read_text() == "host's\n"
        # What the sandbox wrote is stored with its host IDs (uid n inside = base + n).
        assert (upper / "work/own.txt").stat().st_uid == base
        assert (upper / "home/user/u.txt").stat().st_uid == base + 1000

        # Even with a host path in reach (the host's own mount table), the sandbox's root — with every
        # capability of its user namespace — can write none of host root's files: they are outside its map.
        pid = min(procs)
        (tmp_path / "plain").write_text("host's\n")
        (tmp_path / "plain").chmod(0o644)
        attempt = (
            "import sys\n"
            "for p in sys.argv[1:]:\n"
            "    try:\n"
            "        open(p, 'a').write('x'); print(p, 'written')\n"
            "    except OSError as e:\n"
            "        print(p, e.strerror)\n"
        )
        done = subprocess.run(
            [
                *("nsenter", f"--user=/proc/{pid}/ns/user", "--setuid=0", "--setgid=0", "python3", "-c", attempt),
                *(str(tmp_path / "plain"), "/etc/hostname", str(d.sandbox_dir(sid) / "record.json")),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        results = dict(line.rsplit(" ", 1) if " " in line else (line, "") for line in done.stdout.splitlines())
        assert all(r.endswith("denied") for r in results.values()), done.stdout
        assert (tmp_path / "plain").read_text() == "host's\n"
        await c.delete(ref_of(created))


async def test_mount_table_inside_shows_no_host_path(sandboxd: DaemonFactory, tmp_path: Path) -> None:
    host = _host_dir(tmp_path)
    d = sandboxd(ro_binds={"/opt/hostdir": str(host)})
    async with d.client() as c:
        created = await c.create(CreateRequest(request_id="m1", argv=PROBE_ARGV, env={"PROBE": PROBE}))
        upper = d.sandbox_dir(created.sandbox.sandbox_id) / "upper"
        wait_until(lambda: (upper / "work/ready").exists())
        out = json.loads((upper / "work/ready").read_text())
        table = out["mounts"]
        assert str(tmp_path) not in table, table  # the state dir, the images, the bind source
        assert "lowerdir+=/," in table and "upperdir=upper,workdir=ovlwork" in table, table
        # mountinfo also names each mount's root within its filesystem: "/" for the overlays (the root, and
        # the ro_binds), no host path. Known exception: the run dir at /run/adx (and an execd sandbox's control
        # dir) are binds of dirs in the state dir, shared with the host, whose root field is that path.
        lines = out["mountinfo"].splitlines()
        shared = [line for line in lines if line.split()[4] in ("/run/adx", "/run/adx-control")]
        assert [line for line in lines if str(tmp_path) in line and line not in shared] == [], lines
        assert any(line.split()[3:5] == ["/", "/opt/hostdir"] for line in lines), lines
        await c.delete(ref_of(created))


@pytest.mark.req("ENV-2")
async def test_checkpoint_and_restore_keep_ownership_in_the_same_or_another_slice(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        src = await c.create(CreateRequest(request_id="src", argv=PROBE_ARGV, env={"PROBE": PROBE}))
        sid, base = src.sandbox.sandbox_id, src.sandbox.id_base
        assert base is not None
        wait_until(lambda: (d.sandbox_dir(sid) / "upper/work/ready").exists())
        ck = await c.checkpoint(ref_of(src))
        checker = (
            "python3 -c 'import os,json; s=lambda p: [os.stat(p).st_uid, os.stat(p).st_gid];"
            ' json.dump({p: s(p) for p in ("/home/user", "/home/user/u.txt", "/work/own.txt", "/etc/passwd")},'
            ' open("/work/seen.json", "w"))\' && exec sleep 1000'
        )
        # The source still runs: its slice is taken, so this restore gets another and the layer is shifted.
        argv = ["/bin/sh", "-c", checker]
        other = await c.restore(RestoreRequest(request_id="r-other", location=ck.location, digest=ck.digest, argv=argv))
        assert other.sandbox.id_base not in (None, base)
        # Pause as a node does it (checkpoint, delete), then resume: the slice is free again and comes back.
        await c.delete(ref_of(src))
        same = await c.restore(RestoreRequest(request_id="r-same", location=ck.location, digest=ck.digest, argv=argv))
        assert same.sandbox.id_base == base
        for restored in (other, same):
            rid, rbase = restored.sandbox.sandbox_id, restored.sandbox.id_base
            assert rbase is not None
            seen = d.sandbox_dir(rid) / "upper/work/seen.json"
            wait_until(seen.exists)
            inside = json.loads(seen.read_text())
            assert inside == {
                "/home/user": [1000, 1000],
                "/home/user/u.txt": [1000, 1000],
                "/work/own.txt": [0, 0],
                "/etc/passwd": [0, 0],
            }
            upper = d.sandbox_dir(rid) / "upper"
            assert (upper / "home/user/u.txt").stat().st_uid == rbase + 1000
            assert (upper / "work/own.txt").stat().st_gid == rbase
            await c.delete(ref_of(restored))


async def test_user_namespace_off_keeps_host_ids(sandboxd: DaemonFactory) -> None:
    d = sandboxd(user_namespace="off")
    async with d.client() as c:
        health = await c.health()
        assert health.user_namespace is False and health.user_namespace_note
        created = await c.create(CreateRequest(request_id="off", argv=PROBE_ARGV, env={"PROBE": PROBE}))
        assert created.sandbox.id_base is None
        upper = d.sandbox_dir(created.sandbox.sandbox_id) / "upper"
        wait_until(lambda: (upper / "work/ready").exists())
        out = json.loads((upper / "work/ready").read_text())
        assert out["uid_map"] == ["0", "0", "4294967295"]
        assert (upper / "work/own.txt").stat().st_uid == 0
        assert "upperdir=upper,workdir=ovlwork" in out["mounts"]  # no host path either way
        await c.delete(ref_of(created))


@pytest.mark.req("SBX-10")
async def test_slices_survive_a_sigkill_restart_and_are_never_handed_out_twice(sandboxd: DaemonFactory) -> None:
    d = sandboxd()
    async with d.client() as c:
        kept = await c.create(CreateRequest(request_id="k", argv=["sleep", "1000"]))
        gone = await c.create(CreateRequest(request_id="g", argv=["sleep", "1000"]))
        bases = [kept.sandbox.id_base, gone.sandbox.id_base]
        assert bases[0] is not None and bases[1] == bases[0] + IDS_PER_SANDBOX  # the lowest free slices
        await c.delete(ref_of(gone))  # its slice is free again once reclaimed
    procs = d.settled_procs(kept.sandbox.sandbox_id, count=1)
    d.kill()  # SIGKILL: the record is what the next daemon knows
    d.start()
    async with d.client() as c:
        info = await c.get(ref_of(kept))
        assert info.id_base == kept.sandbox.id_base
        assert all(_status_ids(pid) == (info.id_base, info.id_base) for pid in procs)
        fresh = [await c.create(CreateRequest(request_id=f"n{i}", argv=["sleep", "1000"])) for i in range(2)]
        # The lowest free slices: the deleted sandbox's, then the next; never the running one's.
        assert {f.sandbox.id_base for f in fresh} == {gone.sandbox.id_base, max(bases) + IDS_PER_SANDBOX}
        assert info.id_base not in {f.sandbox.id_base for f in fresh}
        for x in fresh:
            await c.delete(ref_of(x))
        await c.delete(ref_of(kept))


def test_id_range_is_validated_and_exhaustion_is_a_clear_conflict() -> None:
    with pytest.raises(ValidationError, match="multiple of 65536"):
        SandboxdConfig.model_validate({"id_range": {"start": 1 << 20, "count": 65536 + 1}})
    with pytest.raises(ValidationError, match="largest uid"):
        SandboxdConfig.model_validate({"id_range": {"start": 0xFFFF0000, "count": 1 << 20}})
    with pytest.raises(ValidationError, match="user_namespace"):
        SandboxdConfig.model_validate({"user_namespace": "yes"})
    start = 1 << 20
    assert allocate([], start, 2 * IDS_PER_SANDBOX) == start
    assert allocate([start], start, 2 * IDS_PER_SANDBOX, prefer=start) == start + IDS_PER_SANDBOX
    assert allocate([], start, 2 * IDS_PER_SANDBOX, prefer=start + IDS_PER_SANDBOX) == start + IDS_PER_SANDBOX
    assert allocate([], start, 2 * IDS_PER_SANDBOX, prefer=start + 5) == start  # not a slice: ignored
    with pytest.raises(ConflictError, match="exhausted"):
        allocate([start, start + IDS_PER_SANDBOX], start, 2 * IDS_PER_SANDBOX)
