"""Volumes at the sandboxd level (docs/volumes.md, docs/sandboxd.md "User namespaces"): ``CreateRequest.volumes``
binds a host directory read-write, ``nosuid``/``nodev``; with a user namespace it is an idmapped mount, so the
files' on-disk owners are the sandbox's own IDs, unshifted (the same in every sandbox, whatever its slice)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from sbx_helpers import DaemonFactory, wait_until

from adx.sandboxd import CreateRequest, ref_of

PROBE = r"""
import json, os
v = "/mnt/vol"
out = {"seen": {n: [os.stat(f"{v}/{n}").st_uid, open(f"{v}/{n}").read()] for n in ("by-host-root", "by-host-1000")}}
open(f"{v}/by-sandbox-root", "w").write("root\n")
open(f"{v}/by-sandbox-user", "w").write("user\n")
os.chown(f"{v}/by-sandbox-user", 1000, 1000)
out["mount"] = [line for line in open("/proc/mounts") if " /mnt/vol " in line]
out["uid_map"] = open("/proc/self/uid_map").read().split()
open(f"{v}/ready.json", "w").write(json.dumps(out))
"""
ARGV = ["/bin/sh", "-c", 'python3 -c "$PROBE" && exec sleep 1000']


def _volume(tmp_path: Path) -> Path:
    vol = tmp_path / "volume"
    vol.mkdir()
    os.chown(vol, 1000, 1000)
    (vol / "by-host-root").write_text("host root\n")
    (vol / "by-host-1000").write_text("host 1000\n")
    os.chown(vol / "by-host-1000", 1000, 1000)
    return vol


@pytest.mark.parametrize("userns", ["auto", "off"])
async def test_a_volume_is_a_read_write_bind_with_unshifted_owners(
    sandboxd: DaemonFactory, tmp_path: Path, userns: str
) -> None:
    vol = _volume(tmp_path)
    d = sandboxd(user_namespace=userns)
    async with d.client() as c:
        created = await c.create(
            CreateRequest(request_id="v1", argv=ARGV, env={"PROBE": PROBE}, volumes={"/mnt/vol": str(vol)})
        )
        wait_until(lambda: (vol / "ready.json").exists())
        out = json.loads((vol / "ready.json").read_text())
        mapped = created.sandbox.id_base is not None
        assert mapped == (userns == "auto")
        if mapped:
            assert out["uid_map"][1] == str(created.sandbox.id_base) != "0"  # root inside is not host root
        # The host's owners are the sandbox's, both ways, with or without a user namespace.
        assert out["seen"] == {"by-host-root": [0, "host root\n"], "by-host-1000": [1000, "host 1000\n"]}
        assert (vol / "by-sandbox-root").stat().st_uid == 0
        assert (vol / "by-sandbox-user").stat().st_uid == 1000
        (mount,) = out["mount"]
        options = mount.split()[3].split(",")
        assert "rw" in options and "nosuid" in options and "nodev" in options, mount
        await c.delete(ref_of(created))
    assert (vol / "by-sandbox-root").read_text() == "root\n"  # the files outlive the sandbox


async def test_a_missing_volume_directory_fails_the_create(sandboxd: DaemonFactory, tmp_path: Path) -> None:
    d = sandboxd()
    async with d.client() as c:
        with pytest.raises(Exception, match="mounts"):
            await c.create(CreateRequest(request_id="v2", argv=["true"], volumes={"/mnt/v": str(tmp_path / "none")}))


async def test_a_create_with_volumes_never_claims_a_warm_member(sandboxd: DaemonFactory, tmp_path: Path) -> None:
    """A warm member's mounts were made before the create: a create that mounts a volume must go cold, or the
    volume would be missing inside (seen when the warm pool met volumes: both merged the same day)."""
    vol = _volume(tmp_path)
    d = sandboxd(warm_pool=2, user_namespace="on", defaults={"network": "veth"})
    async with d.client() as c:
        for _ in range(600):  # the defaults' shape is kept warm from the start
            pool = (await c.health()).warm_pool
            assert pool is not None
            if pool.ready >= 1:
                break
            await asyncio.sleep(0.05)
        assert pool.ready >= 1, f"the warm pool never had a ready member: {pool}"
        created = await c.create(
            CreateRequest(request_id="w1", argv=ARGV, env={"PROBE": PROBE}, volumes={"/mnt/vol": str(vol)})
        )
        wait_until(lambda: (vol / "ready.json").exists())
        out = json.loads((vol / "ready.json").read_text())
        assert len(out["mount"]) == 1, out
        after = (await c.health()).warm_pool
        assert after is not None and after.claims == 0, after  # cold, not a claim
        await c.delete(ref_of(created))
