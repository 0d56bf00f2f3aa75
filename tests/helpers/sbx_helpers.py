"""Helpers for sandboxd tests: real ``adx sandboxd`` subprocesses, real cgroups, namespaces and overlays.

Every daemon a test starts uses a unique cgroup parent; the finalizer SIGKILLs the daemons, kills every
sandbox cgroup under that parent with ``cgroup.kill`` (so supervisors record and exit), removes the cgroup
directories and the socket dirs — even when the test failed. Nothing outside those parents is touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from adx.sandboxd import SandboxdClient
from adx.sandboxd._cgroups import CgroupLayout, detect_layout
from adx.sandboxd._netpolicy import table_name

LAYOUT: CgroupLayout = detect_layout()


def _hierarchy_roots() -> list[Path]:
    return LAYOUT.roots


def cleanup_cgroup_parent(parent: str) -> None:
    """Kill and remove every sandbox cgroup under ``parent`` (only cgroups our daemons created)."""
    if LAYOUT.v2_root is not None:
        v2 = LAYOUT.v2_root / parent
        if v2.is_dir():
            for child in v2.iterdir():
                if child.is_dir():
                    with contextlib.suppress(OSError):
                        (child / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + 10
    for root in _hierarchy_roots():
        base = root / parent
        if not base.is_dir():
            continue
        for child in base.iterdir():
            if not child.is_dir():
                continue
            while True:
                try:
                    child.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    try:  # a warm pool member's supervisor may remove its cgroup meanwhile
                        procs = (child / "cgroup.procs").read_text().split()
                    except OSError:  # removed (ENOENT) or being removed right now (ENODEV)
                        procs = []
                    for pid in procs:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
                    time.sleep(0.01)
        with contextlib.suppress(OSError):
            base.rmdir()


def remove_sandbox_cgroup(parent: str, sandbox_id: str) -> None:
    """rmdir one (empty) sandbox cgroup in every hierarchy."""
    for root in _hierarchy_roots():
        with contextlib.suppress(FileNotFoundError):
            (root / parent / sandbox_id).rmdir()


class Daemon:
    """One sandboxd instance on its own state dir, run as a real subprocess (so SIGKILL is real)."""

    def __init__(self, state_dir: Path, cgroup_parent: str, extra: dict[str, Any] | None = None) -> None:
        self.state_dir = state_dir
        self.cgroup_parent = cgroup_parent
        self.sock_dir = Path(tempfile.mkdtemp(prefix="adxsb-", dir="/tmp"))
        os.rmdir(self.sock_dir)  # sandboxd creates it 0700 itself
        self.socket = self.sock_dir / "sandboxd.sock"
        self.config_path = state_dir.parent / f"{state_dir.name}.toml"
        self.log_path = state_dir.parent / f"{state_dir.name}.log"
        self.extra = extra or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.write_config()

    def write_config(self, **overrides: Any) -> None:
        lines = [
            f'state_dir = "{self.state_dir}"',
            f'socket_path = "{self.socket}"',
            f'cgroup_parent = "{self.cgroup_parent}"',
            "maintenance_interval_seconds = 0.2",
            "delete_timeout_seconds = 5.0",
        ]
        if "warm_pool" not in {**self.extra, **overrides}:
            # Off unless a test asks: tests assert cold allocation (ID slices, /30s, cgroups); test_warm_pool.py
            # covers the pool.
            lines.append("warm_pool = 0")
        for key, value in {**self.extra, **overrides}.items():
            if isinstance(value, dict):
                continue
            lines.append(f"{key} = {_toml(value)}")
        tables: dict[str, dict[str, Any]] = {
            # Generous CPU capacity (quotas overcommit), small default sandboxes: tests run many at once.
            "capacity": {"cpu_millis": 1_000_000},
            "defaults": {"cpu_millis": 250, "memory_bytes": 128 << 20},
        }
        for key, value in {**self.extra, **overrides}.items():
            if isinstance(value, dict):
                tables[key] = {**tables.get(key, {}), **value}
        for key, value in tables.items():
            if isinstance(value, dict):
                lines.append(f"[{key}]")
                lines += [f'"{k}" = {_toml(v)}' for k, v in value.items()]
        self.config_path.write_text("\n".join(lines) + "\n")

    def spawn(self, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            [sys.executable, "-m", "adx", "sandboxd", "--config", str(self.config_path)],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        log.close()
        self.proc = proc
        return proc

    def start(self, env: dict[str, str] | None = None, timeout: float = 30.0) -> Daemon:
        proc = self.spawn(env)
        deadline = time.monotonic() + timeout
        while not self._accepting():
            if proc.poll() is not None:
                raise AssertionError(f"sandboxd exited with {proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"sandboxd did not start within {timeout}s:\n{self.log()}")
            time.sleep(0.01)
        return self

    def _accepting(self) -> bool:
        # A SIGKILLed predecessor leaves its socket file behind: readiness is a successful connect.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(str(self.socket))
            except OSError:
                return False
        return True

    def run_to_exit(self, timeout: float = 30.0) -> tuple[int, str]:
        """Start a daemon expected to refuse; return (exit status, its output)."""
        before = self.log_path.stat().st_size if self.log_path.exists() else 0
        proc = self.spawn()
        proc.wait(timeout)
        return proc.returncode, self.log_path.read_bytes()[before:].decode(errors="replace")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the daemon (its spawner exits on EOF; supervisors and sandboxes live on)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)

    def client(self) -> SandboxdClient:
        return SandboxdClient(self.socket, timeout=30.0)

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.state_dir / "sandboxes" / sandbox_id

    def v2_cgroup(self, sandbox_id: str) -> Path:
        assert LAYOUT.v2_root is not None
        return LAYOUT.v2_root / self.cgroup_parent / sandbox_id

    def cgroup_procs(self, sandbox_id: str) -> set[int]:
        path = self.v2_cgroup(sandbox_id) / "cgroup.procs"
        return {int(x) for x in path.read_text().split()} if path.exists() else set()

    def settled_procs(self, sandbox_id: str, count: int = 3, timeout: float = 10.0) -> set[int]:
        """The sandbox's processes once exactly ``count`` exist (SLEEPER's transient subshell has exited)."""
        return wait_until(lambda: len(procs := self.cgroup_procs(sandbox_id)) == count and procs, timeout=timeout)

    def supervisor_pid(self, sandbox_id: str) -> int:
        """The process holding the sandbox's lifecycle lock open (the daemon itself opens it only briefly)."""
        lock = str(self.sandbox_dir(sandbox_id) / "lifecycle.lock")
        assert self.proc is not None
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == self.proc.pid:
                continue
            try:
                if any(os.readlink(fd) == lock for fd in (proc / "fd").iterdir()):
                    return int(proc.name)
            except OSError:
                continue
        raise AssertionError(f"no supervisor holds {lock}")

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.sock_dir, ignore_errors=True)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        return json.dumps(value)  # a JSON array of strings/numbers is a TOML array
    return f'"{value}"'


class DaemonFactory:
    def __init__(self, base: Path, images_dir: Path | None = None) -> None:
        self.base = base
        self.images_dir = images_dir
        self.parent = f"adx-test-{uuid.uuid4().hex[:10]}"
        self.daemons: list[Daemon] = []

    def __call__(self, name: str = "d1", start: bool = True, **extra: Any) -> Daemon:
        if self.images_dir is not None:
            extra.setdefault("images_dir", str(self.images_dir))
        daemon = Daemon(self.base / name, f"{self.parent}/{name}", extra)
        self.daemons.append(daemon)
        if start:
            daemon.start()
        return daemon

    def cleanup(self) -> None:
        for daemon in self.daemons:
            daemon.close()
        for daemon in self.daemons:
            cleanup_cgroup_parent(daemon.cgroup_parent)
            # A killed daemon leaves its nftables table (a stopped one removes it): remove it here.
            subprocess.run(
                ["nft", "delete", "table", "inet", table_name(daemon.state_dir)], capture_output=True, check=False
            )
        for root in _hierarchy_roots():
            with contextlib.suppress(OSError):
                (root / self.parent).rmdir()


def wait_until(predicate: Any, timeout: float = 10.0, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)
