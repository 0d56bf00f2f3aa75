"""E2B's ``user`` account through the real ``e2b`` SDK against ``adx up``: commands run as ``user`` in
``/home/user`` with HOME set, relative file paths resolve there, written files belong to ``user`` and entries
report owner and group; ``user="root"`` acts as root in ``/root``. The host-derived default image carries
``user`` in its skeleton (made once per node, not by execd at a sandbox's first command); an image without it
gets it from execd on first use, in the sandbox's own writable ``/etc`` (the host's account files stay as they
were)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import AsyncSandbox, CommandExitException, PtySize, Sandbox
from e2b.sandbox.filesystem.filesystem import FileType
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType
from e2b_up import Up, running_up, seed_debian_image

from adx.sandboxd._image import ensure_default_image

pytestmark = pytest.mark.slow


@pytest.fixture
def sandbox(adx_up: Up) -> Iterator[Sandbox]:
    made = Sandbox.create(**adx_up.opts())
    yield made
    made.kill()


def _host_accounts() -> str:
    return hashlib.sha256(b"".join(Path(p).read_bytes() for p in ("/etc/passwd", "/etc/group"))).hexdigest()


def test_commands_run_as_user_in_its_home(sandbox: Sandbox) -> None:
    host_before = _host_accounts()
    out = sandbox.commands.run("whoami; id -u; id -g; id -gn; pwd; echo $HOME; echo $USER").stdout.split()
    assert out == ["user", "1000", "1000", "user", "/home/user", "/home/user", "user"]
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    sandbox.files.make_dir("sub")
    assert sandbox.commands.run("pwd", cwd="sub").stdout == "/home/user/sub\n"  # a relative cwd: in the home
    # The home is the user's own: it can write there, and not where only root may.
    sandbox.commands.run("echo mine > ~/mine.txt")
    with pytest.raises(CommandExitException):
        sandbox.commands.run("touch /etc/not-mine")
    # A background command and a PTY run as the user too.
    assert sandbox.commands.run("whoami", background=True).wait().stdout == "user\n"
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.send_stdin(terminal.pid, b"echo who-$(whoami)-at-$(pwd)-home-$HOME; exit\n")
    seen = bytearray()
    terminal.wait(on_pty=seen.extend)
    assert b"who-user-at-/home/user-home-/home/user" in seen, bytes(seen)
    assert _host_accounts() == host_before, "the account was made inside the sandbox, not on the host"


def test_the_host_derived_image_carries_e2bs_user(tmp_path: Path) -> None:
    """The skeleton's ``/etc`` is the host's, with E2B's ``user`` (uid/gid 1000, ``/home/user``, bash) in place of
    a host account that held uid or gid 1000 (its home is never in a sandbox), and ``/home/user`` is the user's
    own, with ``/etc/skel``'s files: no sandbox pays for making it at its first command (issue 14's TTI)."""
    host = tmp_path / "host"
    (host / "etc/skel").mkdir(parents=True)
    (host / "etc/skel/.profile").write_text("# skel\n")
    (host / "etc/passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\ncloudsdk:x:1000:1000::/home/cloudsdk:/bin/bash\n"
        "user:x:1500:1500::/home/user:/bin/sh\nother:x:1001:1001::/home/other:/bin/sh\n"
    )
    (host / "etc/group").write_text("root:x:0:\ncloudsdk:x:1000:\nuser:x:1500:\nother:x:1001:\n")
    (host / "etc/profile").write_text('if [ "$(id -u)" -eq 0 ]; then PATH=/root-path; else PATH=/user-path; fi\n')
    root = ensure_default_image(tmp_path / "images", host_root=host) / "root"
    passwd = (root / "etc/passwd").read_text().splitlines()
    assert passwd == [
        "root:x:0:0:root:/root:/bin/bash",
        "other:x:1001:1001::/home/other:/bin/sh",
        "user:x:1000:1000::/home/user:/bin/bash",
    ]
    assert (root / "etc/group").read_text().splitlines() == ["root:x:0:", "other:x:1001:", "user:x:1000:"]
    home = root / "home/user"
    assert (home.stat().st_uid, home.stat().st_gid, home.stat().st_mode & 0o777) == (1000, 1000, 0o755)
    profile = home / ".profile"
    assert profile.read_text() == "# skel\n" and (profile.stat().st_uid, profile.stat().st_gid) == (1000, 1000)
    assert not (root / "etc/shadow").exists()  # still no secrets in the shared layer (SEC-3)
    # The host's own files are as they were.
    assert "cloudsdk" in (host / "etc/passwd").read_text()
    # Every E2B command is a login shell: its /etc/profile reads bash's EUID instead of running id (same answer;
    # sh still runs id).
    profile = (root / "etc/profile").read_text()
    assert '"$(id -u)"' not in profile and '"${EUID:-$(id -u)}"' in profile
    for shell in ("bash", "sh"):
        out = subprocess.run([shell, "-c", f". {root}/etc/profile; echo $PATH"], capture_output=True, text=True)
        assert out.stdout == ("/root-path\n" if os.geteuid() == 0 else "/user-path\n"), shell


def test_a_node_image_of_the_older_skeleton_is_replaced_and_kept_aside(tmp_path: Path) -> None:
    """A node built its image before the skeleton had ``user``: its next start gives it the new one, and the old
    directory stays (renamed aside) for sandboxes that run on it."""
    images = tmp_path / "images"
    old = ensure_default_image(images)
    meta = json.loads((old / "image.json").read_text())
    del meta["skeleton"]  # what an image of the first skeleton says
    (old / "image.json").write_text(json.dumps(meta))
    (old / "root/etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    new = ensure_default_image(images)
    assert new == old and "user:x:1000:1000:" in (new / "root/etc/passwd").read_text()
    [aside] = images.glob(".default-skeleton-1-*/default")
    assert (aside / "root/etc/passwd").read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    assert ensure_default_image(images) == new and len(list(images.glob(".default-skeleton-*"))) == 1


def test_a_fresh_sandbox_has_user_before_its_first_command(sandbox: Sandbox) -> None:
    """The first command as ``user`` finds the account in the image: execd made nothing (its lazy creation
    writes ``/etc/shadow``, which the host-derived image does not have)."""
    out = sandbox.commands.run("id; stat -c '%u:%g %a' /home/user; test -e /etc/shadow && echo made || echo none")
    assert out.stdout.splitlines() == ["uid=1000(user) gid=1000(user) groups=1000(user)", "1000:1000 755", "none"]


def test_relative_paths_and_ownership_of_written_files(sandbox: Sandbox) -> None:
    info = sandbox.files.write("notes/today.txt", "written by the SDK")
    assert (info.name, info.path) == ("today.txt", "/home/user/notes/today.txt")
    assert sandbox.commands.run("cat /home/user/notes/today.txt").stdout == "written by the SDK"
    assert sandbox.files.read("notes/today.txt") == "written by the SDK"
    assert sandbox.files.read("~/notes/today.txt") == "written by the SDK"
    assert sandbox.commands.run("stat -c '%U:%G' notes notes/today.txt").stdout.split() == ["user:user"] * 2
    # The user can change what it was given: it owns it.
    sandbox.commands.run("echo more >> notes/today.txt")

    entry = sandbox.files.get_info("notes/today.txt")
    assert (entry.path, entry.owner, entry.group, entry.type) == (
        "/home/user/notes/today.txt",
        "user",
        "user",
        FileType.FILE,
    )
    listed = {e.name: e for e in sandbox.files.list(".")}
    assert (listed["notes"].owner, listed["notes"].group, listed["notes"].path) == ("user", "user", "/home/user/notes")
    root_owned = {e.name: e for e in sandbox.files.list("/")}["etc"]
    assert (root_owned.owner, root_owned.group) == ("root", "root")

    assert sandbox.files.make_dir("made/deeper") is True
    assert sandbox.files.get_info("made/deeper").owner == "user"
    moved = sandbox.files.rename("notes/today.txt", "made/deeper/moved.txt")
    assert (moved.path, moved.owner) == ("/home/user/made/deeper/moved.txt", "user")
    assert sandbox.files.exists("made/deeper/moved.txt") and not sandbox.files.exists("notes/today.txt")
    sandbox.files.remove("made")
    assert not sandbox.files.exists("/home/user/made")
    sandbox.files.write_files([{"path": "a.txt", "data": "a"}, {"path": "/tmp/b.txt", "data": "b"}])
    assert sandbox.commands.run("stat -c '%U' ~/a.txt /tmp/b.txt").stdout.split() == ["user", "user"]


def test_user_root_still_works(sandbox: Sandbox) -> None:
    out = sandbox.commands.run("whoami; pwd; echo $HOME", user="root").stdout.split()
    assert out == ["root", "/root", "/root"]
    info = sandbox.files.write("by-root.txt", "r", user="root")
    assert info.path == "/root/by-root.txt"
    entry = sandbox.files.get_info("by-root.txt", user="root")
    assert (entry.owner, entry.group) == ("root", "root")
    assert sandbox.files.read("/root/by-root.txt", user="root") == "r"
    assert sandbox.commands.run("touch /etc/by-root && stat -c %U /etc/by-root", user="root").stdout == "root\n"
    # The default stays E2B's ``user`` after a root call.
    assert sandbox.commands.run("whoami").stdout == "user\n"


@pytest.fixture(scope="module")
def debian_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """``adx up`` whose ``base`` is the Debian image (its own ``user`` account and sudo). The image comes from the
    cache tests/sandboxd/test_images.py builds (built here when missing: ~4 min once per machine) and is
    hard-linked into this ``adx up``'s store, so its sandboxd does not build it again."""
    root = tmp_path_factory.mktemp("e2b-debian")
    if not seed_debian_image(root):
        pytest.skip("building the Debian image needs mmdebstrap")
    with running_up(root, base_image="debian") as up:
        yield up


def test_sudo_and_the_images_own_user_on_the_debian_image(debian_up: Up) -> None:
    sandbox = Sandbox.create(**debian_up.opts())
    try:
        out = sandbox.commands.run("whoami; id -u; pwd; echo $HOME; sudo -n id -u").stdout.split()
        assert out == ["user", "1000", "/home/user", "/home/user", "0"]
        assert sandbox.commands.run(
            "echo via-sudo | sudo -n tee /etc/by-sudo >/dev/null && cat /etc/by-sudo"
        ).stdout == ("via-sudo\n")
        info = sandbox.files.write("deb.txt", "d")
        assert info.path == "/home/user/deb.txt"
        entry = sandbox.files.get_info("deb.txt")
        assert (entry.owner, entry.group) == ("user", "user")
        assert sandbox.commands.run("whoami; pwd", user="root").stdout.split() == ["root", "/root"]
    finally:
        sandbox.kill()


def test_watch_dir_of_a_relative_path(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("watched")
    handle = sandbox.files.watch_dir("watched")
    sandbox.files.write("watched/new.txt", "x")
    deadline, names = time.monotonic() + 15, set()
    while "new.txt" not in names:
        assert time.monotonic() < deadline, names
        names |= {e.name for e in handle.get_new_events() if e.type in (FilesystemEventType.CREATE,
                                                                         FilesystemEventType.WRITE)}  # fmt: skip
        time.sleep(0.2)
    handle.stop()


def test_async_sdk_is_user_in_home_too(adx_up: Up) -> None:
    async def main() -> None:
        sandbox = await AsyncSandbox.create(**adx_up.opts())
        try:
            result = await sandbox.commands.run("whoami; pwd; echo $HOME")
            assert result.stdout.split() == ["user", "/home/user", "/home/user"]
            info = await sandbox.files.write("async.txt", "a")
            assert info.path == "/home/user/async.txt"
            entry = await sandbox.files.get_info("async.txt")
            assert (entry.owner, entry.group) == ("user", "user")
            root = await sandbox.commands.run("whoami; pwd", user="root")
            assert root.stdout.split() == ["root", "/root"]
        finally:
            await sandbox.kill()

    asyncio.run(main())
