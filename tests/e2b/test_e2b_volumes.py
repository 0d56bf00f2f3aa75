"""Volumes through the real ``e2b`` SDK against ``adx up`` (docs/e2b.md "Volumes", docs/volumes.md): a tenant's
named volume is created and listed through E2B's volume API, its files are reached through the volume content
API the ADX API serves (``E2B_VOLUME_API_URL`` = the API's URL), it is mounted into sandboxes at create
(``volume_mounts``), mounted again at resume, and outlives the sandboxes that used it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
from e2b import AsyncSandbox, AsyncVolume, Sandbox, Volume
from e2b.exceptions import (
    AuthenticationException,
    SandboxException,
    VolumeException,
    VolumeNotFoundException,
    VolumePathNotFoundException,
)

if TYPE_CHECKING:
    from conftest import Up

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def volume_api(adx_up: Up, monkeypatch: pytest.MonkeyPatch) -> None:
    """The set-up docs/e2b.md gives: the volume content API is the ADX API's URL."""
    monkeypatch.setenv("E2B_VOLUME_API_URL", adx_up.url)


def test_a_volume_outlives_its_sandboxes_and_carries_files_both_ways(adx_up: Up) -> None:
    """Create a volume, write a file through the content API, mount it in sandbox A and read it there, write from
    A (as E2B's ``user``), kill A, mount it by name in sandbox B: both files are there, and the content API sees
    A's file with A's owner. A volume in use cannot be destroyed (409); once unused it goes with its files."""
    opts = adx_up.opts()
    vol = Volume.create("sync-data", **opts)
    assert vol.volume_id.startswith("vol-") and vol.name == "sync-data" and vol.token
    made: list[Sandbox] = []
    try:
        entry = vol.write_file("/from-api.txt", "written through the content API")
        assert (entry.path, entry.size, entry.uid, entry.gid) == ("/from-api.txt", 31, 1000, 1000)
        a = Sandbox.create(volume_mounts={"/mnt/data": vol}, **opts)
        made.append(a)
        assert a.files.read("/mnt/data/from-api.txt") == "written through the content API"
        a.files.write("/mnt/data/from-a.txt", "written in sandbox A")  # as `user` (uid 1000)
        a.commands.run("mkdir /mnt/data/dir && echo nested > /mnt/data/dir/n.txt")
        owner = a.commands.run("stat -c '%u:%g' /mnt/data/from-a.txt /mnt/data/from-api.txt").stdout.split()
        assert owner == ["1000:1000", "1000:1000"]
        # The sandbox's root is an unprivileged host ID (its own user namespace): the owners agree on both sides
        # because the volume is an idmapped mount, not because sandbox and host share IDs.
        inside, host, _ = a.commands.run("cat /proc/self/uid_map").stdout.split()
        assert inside == "0" and host != "0"
        a.kill()

        b = Sandbox.create(volume_mounts={"/data": "sync-data"}, **opts)  # by name this time
        made.append(b)
        listed = b.commands.run("ls /data").stdout.split()
        assert listed == ["dir", "from-a.txt", "from-api.txt"]
        assert b.files.read("/data/from-a.txt") == "written in sandbox A"
        # The content API sees what the sandbox wrote, with its owner.
        assert vol.read_file("/from-a.txt") == "written in sandbox A"
        assert vol.read_file("/dir/n.txt", format="bytes") == b"nested\n"
        info = vol.get_info("/from-a.txt")
        assert (info.type.value, info.uid, info.size) == ("file", 1000, 20)
        assert [e.path for e in vol.list("/", depth=2)] == ["/dir", "/dir/n.txt", "/from-a.txt", "/from-api.txt"]

        # Listed and found by ID (with the same token); in use by B: not destroyed.
        assert ("sync-data", vol.volume_id) in [(v.name, v.volume_id) for v in Volume.list(**opts)]
        got = Volume.get_info(vol.volume_id, **opts)
        assert (got.name, got.token) == ("sync-data", vol.token)
        with pytest.raises(VolumeException, match=b.sandbox_id):
            Volume.destroy(vol.volume_id, **opts)
        assert b.files.read("/data/from-api.txt") == "written through the content API"
        b.kill()
        assert Volume.destroy(vol.volume_id, **opts) is True
        assert not (adx_up.state / "volumes" / "default" / "sync-data").exists()
        assert Volume.destroy(vol.volume_id, **opts) is False
        with pytest.raises(VolumeNotFoundException):
            Volume.get_info(vol.volume_id, **opts)
    finally:
        for sandbox in made:
            sandbox.kill()
        Volume.destroy(vol.volume_id, **opts)


@pytest.mark.req("SEC-3")
def test_the_content_api_stays_inside_the_volume(adx_up: Up) -> None:
    """A symlink a sandbox leaves in a volume (to ``/`` or out with ``..``) resolves inside the volume when the
    content API follows it: the host's files are never read or written through a volume."""
    opts = adx_up.opts()
    vol = Volume.create("escape", **opts)
    try:
        sandbox = Sandbox.create(volume_mounts={"/mnt/v": vol}, **opts)
        try:
            sandbox.commands.run("ln -s / /mnt/v/root && ln -s ../../../../etc /mnt/v/up && mkdir /mnt/v/etc")
        finally:
            sandbox.kill()
        assert os.path.exists("/etc/hostname")  # the host's: what the links point at outside the volume
        for path in ("/root/etc/hostname", "/up/hostname", "/../../../../etc/hostname"):
            with pytest.raises(VolumePathNotFoundException):
                vol.read_file(path)
        vol.write_file("/up/planted", "x")  # lands in the volume's own /etc, not the host's
        assert not os.path.exists("/etc/planted")
        assert vol.read_file("/etc/planted") == "x"
        # symlinks are reported as such, with their target as stored
        assert vol.get_info("/root").type.value == "symlink" and vol.get_info("/root").target == "/"
    finally:
        Volume.destroy(vol.volume_id, **opts)


@pytest.mark.req("SEC-2")
def test_volume_errors_in_the_sdks_own_types(adx_up: Up) -> None:
    """Missing volumes, another tenant's volume, a wrong token, bad mount paths and unknown volume names each
    raise the SDK's own exception naming the field."""
    opts = adx_up.opts()
    vol = Volume.create("errors", **opts)
    try:
        with pytest.raises(VolumeException, match="exists"):
            Volume.create("errors", **opts)
        with pytest.raises(VolumeException, match="400: name: must be"):
            Volume.create("no/slash", **opts)
        # Another tenant sees nothing of it: not listed, not found, its token is refused.
        other = adx_up.opts(adx_up.other_key)
        assert vol.volume_id not in [v.volume_id for v in Volume.list(**other)]
        with pytest.raises(VolumeNotFoundException):
            Volume.get_info(vol.volume_id, **other)
        assert Volume.destroy(vol.volume_id, **other) is False
        theirs = Volume.create("errors", **other)  # names are per tenant
        try:
            with pytest.raises(AuthenticationException):
                Volume(vol.volume_id, "errors", token=theirs.token).read_file("/x")
        finally:
            Volume.destroy(theirs.volume_id, **other)
        with pytest.raises(VolumePathNotFoundException):
            vol.read_file("/missing.txt")
        with pytest.raises(VolumePathNotFoundException):
            vol.remove("/missing.txt")
        with pytest.raises(VolumePathNotFoundException):
            vol.write_file("/no/such/dir/f.txt", "x")  # parents only with force=True
        assert vol.write_file("/made/by/force.txt", "x", force=True).size == 1
        with pytest.raises(VolumeException, match="409"):
            vol.make_dir("/made/by")
        changed = vol.update_metadata("/made/by/force.txt", uid=0, gid=0, mode=0o600)
        assert (changed.uid, changed.gid, changed.mode) == (0, 0, 0o600)
        vol.remove("/made")  # a directory goes with its contents
        assert not vol.exists("/made/by/force.txt") and not vol.exists("/made")
        with pytest.raises(SandboxException, match=r"volumeMounts\[0\]\.path") as bad_path:
            Sandbox.create(volume_mounts={"/proc/x": vol}, **opts)
        assert bad_path.value.status_code == 400
        with pytest.raises(SandboxException, match=r"volumeMounts\[0\]\.name.*'nope'"):
            Sandbox.create(volume_mounts={"/mnt/x": "nope"}, **opts)
        with pytest.raises(SandboxException, match=r"volumeMounts\[1\]\.path.*twice"):
            Sandbox.create(volume_mounts={"/mnt/x": vol, "/mnt/x/": vol}, **opts)
    finally:
        Volume.destroy(vol.volume_id, **opts)
    with pytest.raises(VolumeNotFoundException):
        Volume.connect(vol.volume_id, **opts)


def test_a_volume_whose_directory_is_gone_fails_the_start_with_the_nodes_reason(adx_up: Up) -> None:
    """What a create racing a delete (or a node without the volume root's storage) meets: the start fails with
    sandboxd's reason, never a sandbox without its volume."""
    opts = adx_up.opts()
    vol = Volume.create("vanishing", **opts)
    data = adx_up.state / "volumes" / "default" / "vanishing" / "data"
    data.rename(data.with_name("moved"))
    try:
        with pytest.raises(SandboxException, match=r"start failed: volumes\[0\]\.name: volume 'vanishing' has no dir"):
            Sandbox.create(volume_mounts={"/mnt/v": vol}, **opts)
    finally:
        data.with_name("moved").rename(data)
        assert Volume.destroy(vol.volume_id, **opts) is True


async def test_volumes_async_survive_pause_and_resume(adx_up: Up) -> None:
    """The async SDK: a paused sandbox mounts its volume again at its resume (three cycles), and what it wrote
    before each pause is in the volume, never in its checkpoint."""
    opts = adx_up.opts()
    vol = await AsyncVolume.create("async-data", **opts)
    try:
        await vol.make_dir("/logs", mode=0o777)
        sandbox = await AsyncSandbox.create(volume_mounts={"/mnt/data": vol}, **opts)
        try:
            for cycle in range(3):
                await sandbox.commands.run(f"echo {cycle} >> /mnt/data/logs/cycles.txt")
                await sandbox.pause()
                await vol.write_file(f"/while-paused-{cycle}.txt", f"{cycle}\n")
                sandbox = await AsyncSandbox.connect(sandbox.sandbox_id, **opts)
                seen = (await sandbox.commands.run("cat /mnt/data/logs/cycles.txt /mnt/data/while-paused-*")).stdout
                assert seen.split() == [str(i) for i in range(cycle + 1)] + [str(i) for i in range(cycle + 1)]
                mounts = (await sandbox.commands.run("grep ' /mnt/data ' /proc/mounts")).stdout
                assert mounts.strip(), "the volume is mounted again after the resume"
        finally:
            await sandbox.kill()
        assert (await vol.read_file("/logs/cycles.txt")) == "0\n1\n2\n"
        assert [v.name for v in await AsyncVolume.list(**opts) if v.volume_id == vol.volume_id] == ["async-data"]
    finally:
        assert await AsyncVolume.destroy(vol.volume_id, **opts) is True
