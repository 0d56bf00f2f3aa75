"""The ``adx`` command as a user runs it: a real subprocess."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
import redis

from adx.embedded._process import pick_free_port

ADX = [sys.executable, "-m", "adx"]


def cgroup_parent_for(state_dir: Path) -> str:
    from adx.cli._up_cluster import cgroup_parent_name

    return cgroup_parent_name(state_dir)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ADX, *args], capture_output=True, text=True, timeout=60, env=env)


def test_config_check_accepts_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "up.toml"
    path.write_text('[redis]\nappendfsync = "everysec"\n')
    result = run("config", "check", str(path), "--component", "up")
    assert result.returncode == 0, result.stderr
    assert "valid up configuration" in result.stdout


def test_bad_config_is_one_clear_line_and_starts_nothing(tmp_path: Path) -> None:
    path = tmp_path / "up.toml"
    path.write_text("[redis]\nport = -1\n")
    state = tmp_path / "state"
    for args in (
        ("config", "check", str(path), "--component", "up"),
        ("up", "--config", str(path), "--state-dir", str(state)),
    ):
        result = run(*args)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0] == f"adx: error: {path}: redis.port: Input should be greater than or equal to 0"
    assert not state.exists()


def test_bad_global_option_names_it() -> None:
    result = run("--log-level", "loud", "config", "check", "x", "--component", "up")
    assert result.returncode == 2
    assert "--log-level" in result.stderr


def test_up_starts_real_servers_prints_urls_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {**os.environ, "COLUMNS": "200", "ADX_UP__SERVERS_ONLY": "true"}
    proc = subprocess.Popen(
        [*ADX, "up", "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        seen = ""
        deadline = time.monotonic() + 60
        while "Press Ctrl-C" not in seen:
            assert time.monotonic() < deadline, seen
            line = proc.stdout.readline()
            assert line, f"adx up exited early: {proc.stderr.read() if proc.stderr else ''}"
            seen += line
        redis_url = re.search(r"redis://[\d.]+:\d+/0", seen)
        pg_url = re.search(r"postgresql://\S+", seen)
        assert redis_url and pg_url, seen
        assert redis.Redis.from_url(redis_url.group(0)).ping()
        with psycopg.connect(pg_url.group(0)) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "stopped redis" in out and "stopped postgres" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (state / "redis" / "server.json").exists()
    assert not (state / "postgres" / "server.json").exists()


def test_up_detects_reports_and_restarts_a_crashed_server(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [*ADX, "up", "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "ADX_UP__HEALTH_INTERVAL_SECONDS": "0.2", "ADX_UP__SERVERS_ONLY": "true"},
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []

        def read_until(marker: str) -> None:
            deadline = time.monotonic() + 60
            while not any(marker in line for line in lines):
                assert time.monotonic() < deadline, lines
                line = proc.stdout.readline()  # type: ignore[union-attr]
                assert line, f"adx up exited early: {lines}"
                lines.append(line)

        read_until("Press Ctrl-C")
        info = json.loads((state / "redis" / "server.json").read_text())
        client = redis.Redis.from_url(info["url"])
        client.set("survives", "yes")
        os.kill(info["pid"], signal.SIGKILL)
        read_until("restarted redis")
        assert any("redis server crashed" in line for line in lines), lines
        restarted = json.loads((state / "redis" / "server.json").read_text())
        assert restarted["pid"] != info["pid"]
        assert redis.Redis.from_url(restarted["url"]).get("survives") == b"yes"
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_uses_external_servers_when_given(tmp_path: Path, redis_server, postgres_server) -> None:
    state = tmp_path / "state"
    env = {
        **os.environ,
        "ADX_UP__REDIS_URL": redis_server.url,
        "ADX_UP__POSTGRES_URL": postgres_server.url,
        "ADX_UP__SERVERS_ONLY": "true",
    }
    proc = subprocess.Popen(
        [*ADX, "up", "--state-dir", str(state)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        seen = ""
        while "Press Ctrl-C" not in seen:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            seen += line
        assert f"{redis_server.url}  (external)" in seen
        assert f"{postgres_server.url}  (external)" in seen
        assert not (state / "redis").exists() and not (state / "postgres").exists()
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_with_an_unreachable_external_server_fails_clearly(tmp_path: Path) -> None:
    env = {**os.environ, "ADX_UP__REDIS_URL": "redis://127.0.0.1:1/0"}
    result = subprocess.run(
        [*ADX, "up", "--state-dir", str(tmp_path / "s")], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 5
    assert "adx: error: external redis at redis://127.0.0.1:1/0 does not answer" in result.stderr


def test_up_runs_the_whole_cluster_and_the_readme_sdk_snippet_works(tmp_path: Path) -> None:
    """The README's run command, then its three-line SDK snippet, on real daemons (ENV-1 path end to end)."""
    state = tmp_path / "state"
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "ADX_UP__API_LISTEN": "127.0.0.1:0",
        "ADX_UP__NODE_METRICS_LISTEN": f"127.0.0.1:{pick_free_port('127.0.0.1')}",
        "COLUMNS": "200",
    }
    proc = subprocess.Popen(
        [*ADX, "up", "--state-dir", str(state)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        seen = ""
        deadline = time.monotonic() + 120
        while "Press Ctrl-C" not in seen:
            assert time.monotonic() < deadline, seen
            line = proc.stdout.readline()
            assert line, f"adx up exited early: {seen}\n{proc.stderr.read() if proc.stderr else ''}"
            seen += line
        for kind in ("redis", "postgres", "sandboxd", "coordinator", "node", "api"):
            assert re.search(rf"^  {kind}\s", seen, re.M), seen
        assert re.search(r"API key\s+adxk_", seen), seen
        credentials = json.loads((tmp_path / "config" / "adx" / "credentials.json").read_text())
        assert credentials["api_url"].startswith("http://127.0.0.1:")

        snippet = (
            "import adx\n"
            'env = adx.Client().environments.create(cpu=1, memory="512Mi")\n'
            'print(env.commands.run("echo hello").stdout, end="")\n'
            "env.delete()\n"
        )
        result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout == "hello\n"
        metrics = httpx.get(f"http://{env['ADX_UP__NODE_METRICS_LISTEN']}/metrics").text  # MET-4 through `adx up`
        assert 'adx_node_admission_open{node="local"} 1.0' in metrics, metrics
        assert f"node metrics  http://{env['ADX_UP__NODE_METRICS_LISTEN']}/metrics" in seen

        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        for kind in ("api", "node", "coordinator", "sandboxd", "postgres", "redis"):
            assert f"stopped {kind}" in out
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # The cluster's cgroup parent (sandboxd leaves sandboxes and their parent by design): remove it.
        from sbx_helpers import cleanup_cgroup_parent

        cleanup_cgroup_parent(cgroup_parent_for(state.absolute()))
