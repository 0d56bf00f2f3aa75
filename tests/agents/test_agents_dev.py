"""``adx agent dev`` and the quickstart (issue 15), as real processes: the command starts an embedded PostgreSQL
and a worker, the quickstart file from docs/agents-quickstart.md is run exactly as the page says, runs are
submitted by graph name from a process that cannot import the application, and Ctrl-C stops it all cleanly."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agents_workers import tail

from adx.agents import Client, RunStatus
from adx.embedded import EmbeddedPostgres
from adx.embedded._process import proc_start_ticks

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "agents" / "agents_quickstart.py"
DOC = REPO / "docs" / "agents-quickstart.md"
ADX = [sys.executable, "-c", "from adx.cli import main; main()"]


def user_env(**extra: str) -> dict[str, str]:
    """A new user's shell: no PYTHONPATH, no agent variables unless given."""
    drop = ("PYTHONPATH", "ADX_AGENT_DATABASE_URL", "ADX_AGENT_TENANT")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


class Dev:
    starts = 0

    def __init__(self, cwd: Path, *args: str) -> None:
        Dev.starts += 1  # each start its own output files, so a banner is never read from an earlier start
        self.cwd = cwd
        self.out = cwd / f"dev{Dev.starts}.out"
        self.err = cwd / f"dev{Dev.starts}.err"
        self.proc = subprocess.Popen(
            [*ADX, "agent", "dev", *args],
            cwd=cwd,
            env=user_env(),
            stdout=self.out.open("ab"),
            stderr=self.err.open("ab"),
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )

    def text(self) -> str:
        return self.out.read_text(errors="replace") + tail(self.err)

    async def ready(self, within: float = 90.0) -> str:
        """Wait for the banner and the worker; return the database URL the banner printed."""
        deadline = time.monotonic() + within
        while True:
            out = self.out.read_text(errors="replace") if self.out.exists() else ""
            started = self.err.exists() and "agent worker started" in self.err.read_text(errors="replace")
            found = re.search(r"database  (postgresql://\S+)", out)
            if found and started and "Ctrl-C stops" in out:
                return found.group(1)
            if self.proc.poll() is not None:
                raise AssertionError(f"adx agent dev exited with {self.proc.returncode}: {self.text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"adx agent dev not ready in {within}s: {self.text()}")
            await asyncio.sleep(0.1)

    async def interrupt(self, within: float = 60.0) -> int:
        os.killpg(self.proc.pid, signal.SIGINT)  # what Ctrl-C sends: to the whole foreground process group
        return await asyncio.to_thread(self.proc.wait, within)


def postgres_pid(state_dir: Path) -> int:
    info = EmbeddedPostgres(state_dir).read_info()
    assert info is not None
    return info.pid


def run_python(cwd: Path, url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = user_env(ADX_AGENT_DATABASE_URL=url, ADX_AGENT_TENANT="default")
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


BARE_SUBMIT = """
import asyncio, importlib.util
from adx.agents import Client
assert importlib.util.find_spec("agents_quickstart") is None, "the application must not be importable here"
async def main():
    async with await Client.connect() as client:
        run = await client.submit("refund", {"order_id": "B-2", "amount": 7}, version=1)
        print(run.run_id)
asyncio.run(main())
"""


def test_the_quickstart_page_shows_the_example_file_verbatim() -> None:
    assert f"```python\n{EXAMPLE.read_text()}```" in DOC.read_text()


@pytest.mark.slow
async def test_quickstart_runs_as_documented_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "agents_quickstart.py")
    dev = Dev(tmp_path, "agents_quickstart")  # from the file's directory, no PYTHONPATH
    state = tmp_path / ".adx-dev"
    try:
        url = await dev.ready()
        pg = postgres_pid(state)
        # Terminal 2 of the page: python agents_quickstart.py
        done = await asyncio.to_thread(run_python, tmp_path, url, "agents_quickstart.py")
        assert done.returncode == 0, done.stderr + dev.text()
        assert re.search(r"^submitted [0-9a-f-]{36}$", done.stdout, re.M), done.stdout
        assert "succeeded order_id='A-1001' amount=42 status='refunded' approved_by='ann'" in done.stdout
        payments = (tmp_path / "payments.log").read_text().splitlines()
        assert len(payments) == 1 and payments[0].endswith(" A-1001 42")

        # A process that cannot import the application submits by name; the CLI approves; it finishes.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        bare = await asyncio.to_thread(run_python, elsewhere, url, "-c", BARE_SUBMIT)
        assert bare.returncode == 0, bare.stderr
        run_id = bare.stdout.strip()
        resolve = await asyncio.to_thread(
            subprocess.run,
            [*ADX, "agent", "runs", "resolve", run_id, "approve", "--value", '{"by": "cli"}'],
            env=user_env(ADX_AGENT_DATABASE_URL=url, ADX_AGENT_TENANT="default"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert resolve.returncode == 0, resolve.stderr
        async with await Client.connect(url, tenant="default") as client:
            finished = await client.wait(run_id, timeout=60)
        assert finished.status is RunStatus.SUCCEEDED and finished.output["approved_by"] == "cli"
        assert len((tmp_path / "payments.log").read_text().splitlines()) == 2

        # Ctrl-C: the worker drains, PostgreSQL stops, exit status 0.
        assert await dev.interrupt() == 0, dev.text()
        assert "agent dev stopped" in dev.out.read_text()
        assert proc_start_ticks(pg) is None, "the embedded PostgreSQL is still running"
    finally:
        if dev.proc.poll() is None:
            dev.proc.kill()
            dev.proc.wait()
        EmbeddedPostgres(state).stop()


@pytest.mark.slow
async def test_after_sigkill_the_data_stays_and_a_worker_command_loads_the_app_from_cwd(tmp_path: Path) -> None:
    """A SIGKILLed dev leaves PostgreSQL up; ``adx agent worker`` with ``registrations = "MODULE:APP"`` (no
    PYTHONPATH) finishes the waiting run; the next ``adx agent dev`` reuses the server and stops it."""
    shutil.copy(EXAMPLE, tmp_path / "agents_quickstart.py")
    state = tmp_path / ".adx-dev"
    dev = Dev(tmp_path, "agents_quickstart:app", "--state-dir", str(state))
    worker: subprocess.Popen[bytes] | None = None
    try:
        url = await dev.ready()
        async with await Client.connect(url, tenant="default") as client:
            run = await client.submit("refund", {"order_id": "K-9", "amount": 3}, version=1)
            for _ in range(300):
                if (await client.get(run)).status is RunStatus.WAITING:
                    break
                await asyncio.sleep(0.1)
            assert (await client.get(run)).status is RunStatus.WAITING
            dev.proc.kill()
            dev.proc.wait()

            config = tmp_path / "worker.toml"
            config.write_text(f'database_url = "{url}"\nregistrations = "agents_quickstart:app"\n')
            log = tmp_path / "worker.log"
            worker = subprocess.Popen(  # noqa: ASYNC220 - started, not waited for
                [*ADX, "agent", "worker", "--config", str(config)],
                cwd=tmp_path,
                env=user_env(),
                stdout=log.open("ab"),
                stderr=subprocess.STDOUT,
            )
            await client.resolve(run, "approve", {"by": "after-kill"})
            try:
                finished = await client.wait(run, timeout=90)
            except TimeoutError:
                pytest.fail(f"run did not finish: {tail(log)}")
            assert finished.output["approved_by"] == "after-kill"
            assert len((tmp_path / "payments.log").read_text().splitlines()) == 1
            worker.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(worker.wait, 60) == 0, tail(log)

        pg = postgres_pid(state)
        again = Dev(tmp_path, "agents_quickstart", "--state-dir", str(state))
        assert await again.ready() == url  # the same server, reused
        assert "reusing running postgres" in again.err.read_text()
        assert await again.interrupt() == 0, again.text()
        assert proc_start_ticks(pg) is None
    finally:
        for proc in (dev.proc, worker):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        EmbeddedPostgres(state).stop()


def test_dev_names_the_module_the_path_and_the_fix_before_starting_anything(tmp_path: Path) -> None:
    def dev(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*ADX, "agent", "dev", *args], cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=60
        )

    missing = dev("agents_quickstart")  # not copied here
    assert missing.returncode == 2, missing.stderr
    err = " ".join(missing.stderr.split())
    assert "MODULE: no module named 'agents_quickstart'" in err and "sys.path" in err and str(tmp_path) in err
    assert "Run from the directory that holds agents_quickstart.py" in err
    assert "Traceback" not in missing.stderr

    (tmp_path / "needs_dep.py").write_text("import not_installed_pkg_xyz\n")
    needs = dev("needs_dep")
    assert needs.returncode == 2 and "imports 'not_installed_pkg_xyz', which is not installed" in needs.stderr

    shutil.copy(EXAMPLE, tmp_path / "agents_quickstart.py")
    wrong = dev("agents_quickstart:refund")
    assert wrong.returncode == 2
    assert "no adx.agents.App named 'refund' (it has ['app'])" in " ".join(wrong.stderr.split())
    assert not (tmp_path / ".adx-dev").exists(), "no server may start for an application that does not load"


async def test_dev_on_a_given_database_by_file_path_starts_no_server(tmp_path: Path, postgres_dsn: str) -> None:
    shutil.copy(EXAMPLE, tmp_path / "agents_quickstart.py")
    dev = Dev(tmp_path, "agents_quickstart.py", "--database-url", postgres_dsn)
    try:
        assert await dev.ready() == postgres_dsn
        assert "(given with --database-url)" in dev.out.read_text()
        dev.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(dev.proc.wait, 60) == 0, dev.text()
    finally:
        if dev.proc.poll() is None:
            dev.proc.kill()
            dev.proc.wait()
    assert not (tmp_path / ".adx-dev").exists()
