"""envd's ``/run/e2b/.E2B_*`` files, read with the real ``e2b`` SDK (sync and async) against ``adx up``: envd
makes ``/run/e2b`` (0755) at its start and writes ``.E2B_SANDBOX`` (``true``, 0444), ``.E2B_SANDBOX_ID`` and
``.E2B_TEMPLATE_ID`` (0644 under its umask), root's, without a newline; programs and start scripts read them where
the environment variables are not passed on (``sudo``, cron, a service)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from e2b import AsyncSandbox, Sandbox

if TYPE_CHECKING:
    from conftest import Up

pytestmark = pytest.mark.slow

LISTING = "stat -c '%a %U:%G %n' /run/e2b /run/e2b/.E2B_SANDBOX /run/e2b/.E2B_SANDBOX_ID /run/e2b/.E2B_TEMPLATE_ID"


def _modes(listing: str) -> dict[str, str]:
    return {line.split()[2]: " ".join(line.split()[:2]) for line in listing.splitlines()}


def _check(sandbox: Sandbox, template: str = "base") -> None:
    listed = sandbox.commands.run(LISTING)
    assert _modes(listed.stdout) == {
        "/run/e2b": "755 root:root",
        "/run/e2b/.E2B_SANDBOX": "444 root:root",
        "/run/e2b/.E2B_SANDBOX_ID": "644 root:root",
        "/run/e2b/.E2B_TEMPLATE_ID": "644 root:root",
    }
    assert sandbox.files.read("/run/e2b/.E2B_SANDBOX_ID") == sandbox.sandbox_id  # no newline, as envd's
    assert sandbox.files.read("/run/e2b/.E2B_TEMPLATE_ID") == template
    assert sandbox.files.read("/run/e2b/.E2B_SANDBOX") == "true"
    # The same values as the environment's (a command's E2B_SANDBOX_ID is the file's).
    same = sandbox.commands.run('test "$(cat /run/e2b/.E2B_SANDBOX_ID)" = "$E2B_SANDBOX_ID" && echo same')
    assert same.stdout.strip() == "same"


def test_run_files_are_written_at_create_and_kept_across_pause(adx_up: Up) -> None:
    """At create, after a pause woken by a command (auto-resume) and after ``Sandbox.connect``; a sandbox made
    from a snapshot of it names itself, not its source."""
    sandbox = Sandbox.create(**adx_up.opts())
    made: list[Sandbox] = []
    try:
        _check(sandbox)
        assert sandbox.pause() is True
        _check(sandbox)  # woken by its own traffic
        assert sandbox.pause() is True
        _check(Sandbox.connect(sandbox.sandbox_id, **adx_up.opts()))
        snapshot = sandbox.create_snapshot()
        made.append(Sandbox.create(snapshot.snapshot_id, **adx_up.opts()))
        assert made[0].sandbox_id != sandbox.sandbox_id
        _check(made[0])
        Sandbox.delete_snapshot(snapshot.snapshot_id, **adx_up.opts())
    finally:
        for each in (sandbox, *made):
            each.kill()


def test_a_fork_names_itself_in_its_run_files(adx_up: Up) -> None:
    sandbox = Sandbox.create(**adx_up.opts())
    forks: list[Sandbox] = []
    try:
        forks = sandbox.fork()
        (fork,) = forks
        _check(fork)
    finally:
        for each in (sandbox, *forks):
            each.kill()


async def test_run_files_async(adx_up: Up) -> None:
    sandbox = await AsyncSandbox.create(**adx_up.opts())
    try:
        assert (await sandbox.files.read("/run/e2b/.E2B_SANDBOX_ID")) == sandbox.sandbox_id
        assert (await sandbox.files.read("/run/e2b/.E2B_TEMPLATE_ID")) == "base"
        listed = await sandbox.commands.run(LISTING)
        assert _modes(listed.stdout)["/run/e2b/.E2B_SANDBOX_ID"] == "644 root:root"
    finally:
        await sandbox.kill()
