"""The sandbox's accounts: who a command, a file operation or a watcher acts as, and E2B's ``user`` made on first use.

Names are looked up in the sandbox's own ``/etc/passwd`` and ``/etc/group`` (``pwd``/``grp``: built-in modules,
nothing added to execd's start-up). E2B programs expect the account ``user`` (uid/gid 1000, home ``/home/user``,
passwordless sudo); an image without it gets it the first time a request names it. The entries go into the
sandbox's ``/etc/passwd``, ``/etc/group``, ``/etc/shadow`` (and ``/etc/sudoers.d/user`` when the image has sudo):
in a sandbox those live in its writable overlay layer, so neither the host nor the shared image layer changes.
execd only does that as PID 1 (a sandbox's init): an execd run directly on a host never edits the host's accounts.

A plain class and no dataclasses: every import costs every sandbox (tests/execd/test_footprint.py).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from adx.execd._atomic import create_temp, replacing

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["DEFAULT_ACCOUNT", "AccountError", "Identity", "Names", "ensure_account", "lookup", "under_home"]

#: The account E2B's sandboxes run as; the only one execd creates when the image lacks it.
DEFAULT_ACCOUNT = "user"
#: E2B's uid and gid of ``user``.
DEFAULT_ID = 1000
ETC = "/etc"
SUDO_BINARIES = ("/usr/bin/sudo", "/bin/sudo")


class AccountError(Exception):
    """A request named an account this sandbox does not have (``field``: the request's field naming it)."""

    def __init__(self, user: str, reason: str, field: str = "user") -> None:
        super().__init__(f"{field}: {reason}")
        self.user = user
        self.reason = reason
        self.field = field


class Identity:
    """The account a process runs as or a file is created for (execd itself stays root: PID 1 and its sockets)."""

    __slots__ = ("gid", "groups", "home", "name", "uid")

    def __init__(self, name: str, uid: int, gid: int, groups: tuple[int, ...], home: str) -> None:
        self.name = name
        self.uid = uid
        self.gid = gid
        self.groups = groups
        self.home = home


def lookup(user: str) -> Identity | None:
    """``user`` (a name or a numeric uid) in the sandbox's /etc/passwd, or None. Read every time: commands
    such as ``useradd`` may have changed the file since (glibc reads it per call; no nscd in a sandbox)."""
    import pwd

    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, ValueError, OverflowError):
        return None
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    return Identity(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir or "/")


def ensure_account(user: str, field: str = "user") -> Identity:
    """The account ``user``; E2B's ``user`` is created first when the image lacks it (only as a sandbox's PID 1)."""
    if not user or "\x00" in user or ":" in user or "\n" in user:
        raise AccountError(user, f"invalid account name {user!r}", field)
    found = lookup(user)
    if found is not None:
        return found
    if user != DEFAULT_ACCOUNT:
        raise AccountError(user, f"no account {user!r} in this sandbox's /etc/passwd", field)
    if os.getpid() != 1:
        raise AccountError(
            user, f"no account {user!r} here, and execd creates it only as a sandbox's PID 1 (not on a host)", field
        )
    try:
        _create_default_account()
    except OSError as exc:  # e.g. an image whose /etc is read-only: the request fails, naming why
        raise AccountError(user, f"cannot create account {user!r}: {exc.filename}: {exc.strerror}", field) from None
    made = lookup(user)
    if made is None:  # the files were written but NSS does not read them (an image without files in nsswitch)
        raise AccountError(user, f"account {user!r} was added to /etc/passwd but cannot be looked up", field)
    return made


def under_home(path: str, identity: Identity) -> str:
    """An absolute path as given; a relative one (``~/x`` too) under ``identity``'s home, as envd resolves it."""
    if path.startswith("/"):
        return path
    if path == "~" or path.startswith("~/"):
        path = path[2:]
    return os.path.join(identity.home, path) if path else identity.home


class Names:
    """uid/gid -> name for one listing (each name looked up once per request, not once per entry)."""

    __slots__ = ("_groups", "_users")

    def __init__(self) -> None:
        self._users: dict[int, str] = {}
        self._groups: dict[int, str] = {}

    def user(self, uid: int) -> str:
        import pwd  # only listings name owners: not paid at start-up

        return _named(self._users, uid, lambda number: pwd.getpwuid(number).pw_name)

    def group(self, gid: int) -> str:
        import grp

        return _named(self._groups, gid, lambda number: grp.getgrgid(number).gr_name)


def _named(cache: dict[int, str], number: int, lookup: Callable[[int], str]) -> str:
    name = cache.get(number)
    if name is None:
        try:
            name = lookup(number)
        except KeyError:
            name = str(number)  # as ls -l shows an unknown owner or group
        cache[number] = name
    return name


# -- creating E2B's ``user`` -------------------------------------------------------------------------------


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return [line for line in f.read().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def _replace(path: str, lines: list[str], mode: int, gid: int = 0) -> None:
    """Write ``path`` whole, atomically (temp file, fsync, rename): a reader sees the old or the new file.
    An existing file keeps its mode and group (``shadow`` is root:shadow 0640 on Debian)."""
    try:
        st = os.stat(path)
        mode, gid = st.st_mode & 0o7777, st.st_gid
    except FileNotFoundError:
        pass
    tmp = f"{path}.execd-tmp.{os.urandom(4).hex()}"
    fd = create_temp(tmp, mode)
    with replacing(path, tmp, fd):
        os.write(fd, ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
        os.fchown(fd, 0, gid)
        os.fchmod(fd, mode)
        os.fsync(fd)


def _ids(lines: list[str]) -> dict[int, list[str]]:
    """id -> fields of each passwd/group line (the third field is the numeric id)."""
    found: dict[int, list[str]] = {}
    for line in lines:
        fields = line.split(":")
        if len(fields) > 2 and fields[2].isdigit():
            found.setdefault(int(fields[2]), fields)
    return found


def _first_free(taken: dict[int, list[str]], yields: set[str]) -> int:
    """1000 unless an entry holds it that does not yield (``yields``: names that give their id up); then the
    next free id, as ``useradd`` picks."""
    candidate = DEFAULT_ID
    while candidate in taken and taken[candidate][0] not in yields:
        candidate += 1
    return candidate


def _create_default_account() -> None:
    """Add ``user`` to the sandbox's account files, make its home and, with sudo present, its sudoers entry.

    Home directory first and passwd last: the account appears (to ``getpwnam``) only once it is complete.
    The host-derived image carries a copy of the host's /etc/passwd, where uid 1000 may be a host account that
    has no home here: such an entry (a name without a home in this sandbox) yields uid 1000 to ``user``, so
    ``id`` says ``uid=1000(user)`` as on E2B; an account of the image that has its home keeps its id.
    """
    import shutil  # creation only: not paid at start-up

    name = DEFAULT_ACCOUNT
    home = f"/home/{name}"
    passwd, group, shadow = (os.path.join(ETC, f) for f in ("passwd", "group", "shadow"))
    passwd_lines, group_lines, shadow_lines = _read_lines(passwd), _read_lines(group), _read_lines(shadow)
    users, groups = _ids(passwd_lines), _ids(group_lines)
    # Entries copied from a host (their home does not exist in this sandbox) give way to E2B's ids.
    homeless = {f[0] for i, f in users.items() if i >= DEFAULT_ID and len(f) > 5 and not os.path.isdir(f[5])}
    uid = _first_free(users, homeless)
    dropped = {users[uid][0]} if uid in users else set()
    gid = _first_free(groups, dropped)  # the dropped account's own group goes with it
    dropped_groups = {groups[gid][0]} if gid in groups else set()

    shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    os.makedirs(home, mode=0o755, exist_ok=True)
    if os.path.isdir("/etc/skel"):
        shutil.copytree("/etc/skel", home, dirs_exist_ok=True, symlinks=True)
    for root, dirs, files in os.walk(home):
        for entry in (root, *(os.path.join(root, n) for n in dirs + files)):
            os.lchown(entry, uid, gid)
    if any(os.path.exists(b) for b in SUDO_BINARIES):
        os.makedirs(os.path.join(ETC, "sudoers.d"), mode=0o755, exist_ok=True)
        _replace(os.path.join(ETC, "sudoers.d", name), [f"{name} ALL=(ALL:ALL) NOPASSWD: ALL"], 0o440)

    def keep(lines: list[str], gone: set[str]) -> list[str]:
        return [line for line in lines if line.split(":", 1)[0] not in gone | {name}]

    _replace(group, [*keep(group_lines, dropped_groups), f"{name}:x:{gid}:"], 0o644)
    shadow_gid = next((int(f[2]) for f in groups.values() if f[0] == "shadow"), 0)
    days = int(time.time() // 86400)
    # "*": no password to log in with (none is needed: sudo is NOPASSWD, execd starts processes as the uid).
    _replace(shadow, [*keep(shadow_lines, dropped), f"{name}:*:{days}:0:99999:7:::"], 0o640, shadow_gid)
    _replace(passwd, [*keep(passwd_lines, dropped), f"{name}:x:{uid}:{gid}::{home}:{shell}"], 0o644)
