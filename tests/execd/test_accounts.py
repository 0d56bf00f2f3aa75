"""execd acting as an account: E2B's ``user`` made on first use, commands, files and watchers ``as`` a user.

execd runs as PID 1 of its own PID and mount namespaces (as a sandbox's init) with an overlay on ``/etc`` whose
upper layer is the test's (the sandbox's writable layer) and a tmpfs on ``/home``: the host's account files are
the lower layer and must stay byte for byte the same. Root and unshare(1) are needed (skipped otherwise).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from execd_helpers import ExecdProcess, joined, run

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="namespaces and overlays need root and unshare(1)"
)

ACCOUNT_FILES = ("/etc/passwd", "/etc/group", "/etc/shadow")


def _digests() -> dict[str, str]:
    return {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in ACCOUNT_FILES if os.path.exists(p)}


def _sandboxed(short_dir: Path, *, sudo: bool = False, read_only_etc: bool = False) -> list[str]:
    """The prefix that makes execd a sandbox's init: own PID and mount namespaces, /etc on an overlay whose
    upper layer is ``short_dir/up`` (``sudo``: a ``/usr/bin/sudo`` exists, on an overlay of /usr/bin too)."""
    for d in ("up", "work", "binup", "binwork"):
        (short_dir / d).mkdir()
    script = (
        f"mount -t overlay overlay -o lowerdir=/etc,upperdir={short_dir}/up,workdir={short_dir}/work /etc && "
        "mount -t tmpfs tmpfs /home && "
    )
    if read_only_etc:
        script += "mount -o remount,ro /etc && "
    if sudo:
        script += (
            f"mount -t overlay overlay -o lowerdir=/usr/bin,upperdir={short_dir}/binup,workdir={short_dir}/binwork "
            "/usr/bin && : > /usr/bin/sudo && "
        )
    return ["unshare", "--fork", "--pid", "--mount-proc", "sh", "-c", script + 'exec "$@"', "sh"]


@pytest.fixture
def sandboxed(execd_factory: Callable[..., ExecdProcess], short_dir: Path) -> ExecdProcess:
    return execd_factory(prefix=_sandboxed(short_dir))


def test_first_use_creates_user_in_the_writable_layer_only(sandboxed: ExecdProcess, short_dir: Path) -> None:
    before = _digests()
    with sandboxed.client() as client:
        assert client.get("/v1/health").json()["pid"] == 1
        frames, end = run(client, command="id -un; id -u; id -g; id -gn; pwd; echo $HOME $USER", user="user")
        assert end["exitCode"] == 0, frames
        assert joined(frames, "stdout").split("\n")[:6] == ["user", "1000", "1000", "user", "/home/user",
                                                            "/home/user user"]  # fmt: skip
        # Looked up again (not created twice): one entry in each file.
        run(client, command="true", user="user")
        check = "grep -c '^user:' /etc/passwd /etc/group /etc/shadow; stat -c '%U %a' /home/user"
        frames, _ = run(client, command=check)
        assert joined(frames, "stdout").split() == ["/etc/passwd:1", "/etc/group:1", "/etc/shadow:1", "user", "755"]
    upper = short_dir / "up"
    assert "user:x:1000:1000::/home/user:" in (upper / "passwd").read_text()
    assert (upper / "shadow").stat().st_mode & 0o777 == 0o640
    assert not (upper / "sudoers.d").exists(), "no sudo in this namespace: no sudoers entry"
    assert _digests() == before, "the host's account files are untouched"


def test_sudoers_entry_is_written_when_the_image_has_sudo(
    execd_factory: Callable[..., ExecdProcess], short_dir: Path
) -> None:
    execd = execd_factory(prefix=_sandboxed(short_dir, sudo=True))
    with execd.client() as client:
        _, end = run(client, command="true", user="user")
        assert end["exitCode"] == 0
    entry = short_dir / "up" / "sudoers.d" / "user"
    assert entry.read_text() == "user ALL=(ALL:ALL) NOPASSWD: ALL\n"
    assert entry.stat().st_mode & 0o777 == 0o440


def test_files_as_user_resolve_in_its_home_and_belong_to_it(sandboxed: ExecdProcess) -> None:
    with sandboxed.client() as client:
        put = client.put("/v1/files", params={"path": "notes/a/b.txt", "user": "user", "mkdirs": "true"}, content=b"hi")
        assert put.status_code == 201, put.text
        assert put.json()["path"] == "/home/user/notes/a/b.txt"
        stat = client.get("/v1/files/stat", params={"path": "~/notes/a/b.txt", "user": "user"}).json()
        assert (stat["owner"], stat["group"], stat["uid"], stat["gid"]) == ("user", "user", 1000, 1000)
        assert stat["path"] == "/home/user/notes/a/b.txt"
        listed = client.get("/v1/files/list", params={"path": "notes", "user": "user"}).json()
        assert listed["path"] == "/home/user/notes"
        assert [(e["name"], e["owner"], e["group"]) for e in listed["entries"]] == [("a", "user", "user")]
        made = client.post("/v1/files/mkdir", params={"path": "d/e", "user": "user", "parents": "true"})
        assert made.status_code == 201 and made.json()["path"] == "/home/user/d/e"
        moved = client.post("/v1/files/rename", params={"path": "notes/a/b.txt", "to": "out/c.txt", "user": "user"})
        assert moved.status_code == 200, moved.text
        assert moved.json()["path"] == "/home/user/out/c.txt"
        frames, _ = run(client, command="stat -c '%n %U:%G' d d/e out out/c.txt; test -e notes/a/b.txt || echo gone",
                        user="user")  # fmt: skip
        assert joined(frames, "stdout").splitlines() == [
            "d user:user",
            "d/e user:user",
            "out user:user",
            "out/c.txt user:user",
            "gone",
        ]
        # Without a user, files stay root's, and a relative path has nothing to be relative to.
        client.put("/v1/files", params={"path": "/home/user/r.txt"}, content=b"r")
        assert client.get("/v1/files/stat", params={"path": "/home/user/r.txt"}).json()["owner"] == "root"
        bad = client.get("/v1/files/stat", params={"path": "r.txt"})
        assert bad.status_code == 400 and bad.json()["error"]["details"]["field"] == "path"
        missing = client.post("/v1/files/rename", params={"path": "/nope", "to": "/nope2"})
        assert missing.status_code == 404


def test_root_and_unknown_accounts(sandboxed: ExecdProcess) -> None:
    with sandboxed.client() as client:
        frames, _ = run(client, command="id -un; pwd; echo $HOME", user="root")
        assert joined(frames, "stdout").split() == ["root", "/root", "/root"]
        frames, _ = run(client, command="pwd", user="user", cwd="/tmp")
        assert joined(frames, "stdout").strip() == "/tmp"
        frames, _ = run(client, command="echo $HOME", user="user", env={"HOME": "/elsewhere"})
        assert joined(frames, "stdout").strip() == "/elsewhere", "the request's env wins over the account's"
        for user in ("nobody-here", "a:b"):
            resp = client.post("/v1/commands", json={"command": "true", "user": user})
            assert resp.status_code == 400 and resp.json()["error"]["details"]["field"] == "user", resp.text
        resp = client.get("/v1/files/stat", params={"path": "x", "user": "nobody-here"})
        assert resp.status_code == 400 and resp.json()["error"]["details"]["field"] == "user"


def test_watcher_as_user_watches_a_path_in_its_home(sandboxed: ExecdProcess) -> None:
    with sandboxed.client() as client:
        client.post("/v1/files/mkdir", params={"path": "w", "user": "user"})
        made = client.post("/v1/watchers", json={"path": "w", "user": "user", "recursive": False})
        assert made.status_code == 201, made.text
        client.put("/v1/files", params={"path": "w/f", "user": "user"}, content=b"x")
        deadline, names = time.monotonic() + 5, set()
        while "f" not in names and time.monotonic() < deadline:
            events = client.get(f"/v1/watchers/{made.json()['id']}/events", params={"wait": "1"}).json()["events"]
            names |= {e["name"] for e in events}
        assert "f" in names


def test_an_image_whose_etc_cannot_be_written_gets_a_clear_error(
    execd_factory: Callable[..., ExecdProcess], short_dir: Path
) -> None:
    execd = execd_factory(prefix=_sandboxed(short_dir, read_only_etc=True))
    with execd.client() as client:
        resp = client.post("/v1/commands", json={"command": "true", "user": "user"})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["details"]["field"] == "user" and "Read-only file system" in error["message"], error


def test_an_execd_that_is_not_pid1_never_creates_accounts(execd: ExecdProcess) -> None:
    """On a host (not a sandbox's init) execd must not edit the host's /etc/passwd."""
    before = _digests()
    with execd.client() as client:
        if os.path.exists("/home/user") or _has_user():
            pytest.skip("this host has a 'user' account")
        resp = client.post("/v1/commands", json={"command": "true", "user": "user"})
        assert resp.status_code == 400, resp.text
        assert "PID 1" in resp.json()["error"]["message"]
    assert _digests() == before


def _has_user() -> bool:
    import pwd

    try:
        pwd.getpwnam("user")
    except KeyError:
        return False
    return True
