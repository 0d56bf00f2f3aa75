"""``adx execd``: TOML config validated, then exec into the lean ``python -m adx.execd`` (same PID)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx


def adx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "adx", *args], capture_output=True, text=True, timeout=30)


def test_config_is_translated_to_the_lean_process_argv(short_dir: Path) -> None:
    cfg = short_dir / "execd.toml"
    cfg.write_text(
        f'socket = "{short_dir}/s"\ncontrol_socket = "{short_dir}/c"\nsandbox_id = "sb1"\n'
        'workload = ["python3", "-m", "http.server"]\n[probe]\ntcp_port = 8000\ninterval_seconds = 1\n'
    )
    result = adx("execd", "--config", str(cfg), "--sandbox-id", "override", "--print-argv")
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)
    assert argv[1:3] == ["-m", "adx.execd"]
    assert argv[argv.index("--socket") + 1] == f"{short_dir}/s"
    assert argv[argv.index("--sandbox-id") + 1] == "override", "command-line options override the file"
    assert argv[argv.index("--probe-tcp-port") + 1] == "8000"
    assert argv[-4:] == ["--", "python3", "-m", "http.server"]


def test_invalid_config_names_the_key(short_dir: Path) -> None:
    cfg = short_dir / "bad.toml"
    cfg.write_text("[probe]\ncommand = 'true'\ntcp_port = 80\n")
    result = adx("execd", "--config", str(cfg))
    assert result.returncode == 2
    assert "probe" in result.stderr and "exactly one of command or tcp_port" in result.stderr
    cfg.write_text("ring_bytes = 10\n")
    result = adx("execd", "--config", str(cfg))
    assert result.returncode == 2 and "ring_bytes" in result.stderr
    assert adx("config", "check", str(cfg), "--component", "execd").returncode == 2


def test_adx_execd_execs_into_the_lean_process(short_dir: Path) -> None:
    sock = short_dir / "s"
    proc = subprocess.Popen([sys.executable, "-m", "adx", "execd", "--socket", str(sock)], start_new_session=True)
    try:
        deadline = time.monotonic() + 15
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://x") as client:
            health = client.get("/v1/health").json()
        assert health["pid"] == proc.pid, "exec keeps the PID (execd stays PID 1 of a sandbox)"
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1:3] == [b"-m", b"adx.execd"]
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def test_socket_activation_execd_accepts_on_inherited_listeners_and_creates_no_socket_file(short_dir: Path) -> None:
    """``--socket-fd`` / ``--admin-socket-fd``: what sandboxd's supervisor does (bind host-side, pass the fds)."""
    import socket as sk

    client_path, admin_path = short_dir / "bound-c", short_dir / "bound-a"
    listeners = []
    for path in (client_path, admin_path):
        sock = sk.socket(sk.AF_UNIX)
        sock.bind(str(path))
        sock.listen(16)
        listeners.append(sock)
    before = sorted(p.name for p in short_dir.iterdir())
    fds = [s.fileno() for s in listeners]
    proc = subprocess.Popen(
        [sys.executable, "-m", "adx.execd", "--socket-fd", str(fds[0]), "--admin-socket-fd", str(fds[1])],
        pass_fds=fds,
        start_new_session=True,
    )
    for sock in listeners:
        sock.close()  # execd owns the listeners now
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(client_path)), base_url="http://x", timeout=15) as c:
            assert c.get("/v1/health").json()["pid"] == proc.pid
            resp = c.post("/v1/commands", json={"command": "ls -l /proc/$$/fd"})
            assert resp.status_code == 200
            assert "socket:" not in resp.text, f"commands must not inherit execd's listeners: {resp.text}"
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(admin_path)), base_url="http://x", timeout=15) as a:
            assert a.get("/v1/activity").json()["version"] == 2
        assert sorted(p.name for p in short_dir.iterdir()) == before, "no socket file of its own"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    assert adx("execd", "--help").returncode == 0
    both = subprocess.run(
        [sys.executable, "-m", "adx.execd", "--socket", "x", "--socket-fd", "3"], capture_output=True, text=True
    )
    assert both.returncode == 2 and "exactly one of --socket and --socket-fd" in both.stderr
