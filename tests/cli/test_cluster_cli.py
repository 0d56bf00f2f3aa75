"""The CLI on a real ``adx up`` (every daemon a real process: Redis, PostgreSQL, sandboxd, Coordinator, node,
API): it finds the cluster by itself from any directory, ``adx up`` stays quiet while idle, and what it prints
is readable. One cluster for the module (it takes ~15 s to start); each test runs the real ``adx`` command."""

from __future__ import annotations

import json
import re
import subprocess
import time

from cli_helpers import ADX, UpCluster


def test_up_records_where_its_cluster_is(up_cluster: UpCluster) -> None:
    state = up_cluster.state
    recorded = json.loads((up_cluster.config_home / "adx" / "cluster.json").read_text())
    assert json.loads((state / "cluster.json").read_text()) == recorded
    coordinator = json.loads((state / "coordinator" / "server.json").read_text())
    api = json.loads((state / "api" / "server.json").read_text())
    assert recorded == {
        "api_url": f"http://127.0.0.1:{api['port']}",
        "coordinator": f"localhost:{coordinator['port']}",
        "certs_dir": str(state / "certs"),
        "state_dir": str(state),
        "redis_url": json.loads((state / "redis" / "server.json").read_text())["url"],
        "tenant": "default",
    }
    assert (up_cluster.config_home / "adx" / "cluster.json").stat().st_mode & 0o777 == 0o600
    assert f"recorded in {up_cluster.config_home / 'adx' / 'cluster.json'}" in up_cluster.out.read_text()


def test_tenant_create_then_env_list_with_no_flag_from_another_directory(up_cluster: UpCluster) -> None:
    """The issue's must-show: `adx up --state-dir S`, then `adx tenant create alice` works with no other flag."""
    created = up_cluster.adx("tenant", "create", "alice")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("adxk_") and "not shown again" in created.stderr
    # The new key works against the API the CLI also finds by itself (alice has no Environments yet).
    listed = up_cluster.adx("env", "list", "--json", ADX_API_KEY=key)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == {"environments": []}
    # The key is checked for real: a wrong one is refused.
    wrong = up_cluster.adx("env", "list", ADX_API_KEY="adxk_wrong")
    assert wrong.returncode == 7 and "refused the key" in wrong.stderr, wrong.stderr


def test_certs_go_to_the_clusters_directory(up_cluster: UpCluster) -> None:
    issued = up_cluster.adx("certs", "issue", "n2")
    assert issued.returncode == 0, issued.stderr
    assert (up_cluster.state / "certs" / "node-n2.pem").is_file()
    assert not (up_cluster.root / "elsewhere" / ".adx").exists()


def test_cluster_named_by_flag_or_variable_without_any_user_config(up_cluster: UpCluster) -> None:
    """A user with no config of their own (another account, CI) names the cluster by its state directory; the
    key for `env` commands then comes from that state directory too."""
    nobody = up_cluster.root / "nobody"
    nobody.mkdir(exist_ok=True)
    by_flag = up_cluster.adx("--cluster", str(up_cluster.state), "tenant", "create", "bob", XDG_CONFIG_HOME=str(nobody))
    assert by_flag.returncode == 0, by_flag.stderr
    by_variable = up_cluster.adx(
        "env", "list", "--json", XDG_CONFIG_HOME=str(nobody), ADX_CLUSTER=str(up_cluster.state)
    )
    assert by_variable.returncode == 0, by_variable.stderr
    assert "environments" in json.loads(by_variable.stdout)
    assert not (nobody / "adx").exists()


def test_errors_name_the_real_fix(up_cluster: UpCluster) -> None:
    nobody = up_cluster.root / "nobody2"
    nobody.mkdir(exist_ok=True)
    # No cluster recorded and none named: the advice is to start or name one (not `adx certs issue`).
    none = up_cluster.adx("tenant", "create", "carol", XDG_CONFIG_HOME=str(nobody))
    assert none.returncode == 3, none.stderr
    assert "no cluster is recorded" in none.stderr and "adx up" in none.stderr
    assert "adx certs issue" not in none.stderr
    # A named cluster that is not there.
    missing = up_cluster.adx("--cluster", str(nobody / "gone"), "tenant", "create", "carol")
    assert missing.returncode == 3 and f"no cluster at {nobody / 'gone'}" in missing.stderr, missing.stderr
    # A recorded cluster whose Coordinator does not answer (a stopped `adx up`): which cluster, and what to run.
    stopped = up_cluster.root / "stopped"
    stopped.mkdir(exist_ok=True)
    record = json.loads((up_cluster.state / "cluster.json").read_text())
    from adx.embedded._process import pick_free_port

    record.update(state_dir=str(stopped), coordinator=f"localhost:{pick_free_port('127.0.0.1')}")
    (stopped / "cluster.json").write_text(json.dumps(record))
    down = up_cluster.adx("--cluster", str(stopped), "tenant", "create", "carol")
    assert down.returncode == 5, down.stderr
    assert record["coordinator"] in down.stderr and f"is `adx up --state-dir {stopped}` running?" in down.stderr
    # The certificates of the recorded cluster are gone.
    record.update(certs_dir=str(stopped / "certs"))
    (stopped / "cluster.json").write_text(json.dumps(record))
    gone = up_cluster.adx("--cluster", str(stopped), "tenant", "create", "carol")
    assert gone.returncode == 3 and "certificate directory" in gone.stderr and str(stopped) in gone.stderr


def test_up_logs_no_line_per_health_poll(up_cluster: UpCluster) -> None:
    """`adx up` polls every daemon's health every 0.2 s here: idle, it writes nothing (no httpx line per
    `/healthz` poll at info)."""
    before = up_cluster.err.read_text()
    out_before = up_cluster.out.read_text()
    time.sleep(3)  # 15 rounds of polls
    after = up_cluster.err.read_text()
    assert after == before, after[len(before) :]
    assert up_cluster.out.read_text() == out_before
    assert "HTTP Request" not in after and "/healthz" not in after


STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [A-Z][A-Za-z+0-9-]*"  # a date, a time and a zone


def test_env_output_is_human_and_quantities_take_common_spellings(up_cluster: UpCluster) -> None:
    created = up_cluster.adx("env", "create", "--cpu", "250m", "--memory", "0.5GiB", "--idle-timeout", "0", "--json")
    assert created.returncode == 0, created.stderr
    env = json.loads(created.stdout)
    assert env["resources"]["memoryBytes"] == 512 * 2**20 and env["resources"]["cpuMillis"] == 250
    try:
        shown = up_cluster.adx("env", "get", env["id"])
        assert shown.returncode == 0, shown.stderr
        assert "resources        cpu 250m, memory 512Mi, disk not reserved" in shown.stdout, shown.stdout
        assert "lifecycle        idle timeout never\n" in shown.stdout, shown.stdout
        assert re.search(rf"^created          {STAMP}$", shown.stdout, re.M), shown.stdout
        listed = up_cluster.adx("env", "list")
        row = next(line for line in listed.stdout.splitlines() if line.startswith(env["id"]))
        assert re.fullmatch(rf"{env['id']}\s+running\s+local\s+250m\s+512Mi\s+{STAMP}", row), row
        moved = up_cluster.adx("env", "lifetime", env["id"], "600")
        assert moved.returncode == 0, moved.stderr
        assert re.fullmatch(rf"{env['id']} running expires {STAMP} \(in (10m|9m5\ds)\) -> delete\n", moved.stdout), (
            moved.stdout
        )

        # A missing program: 127 as from a shell, with the shell's words, in the CLI (argv or --shell) and SDK.
        argv = up_cluster.adx("env", "exec", env["id"], "--", "no-such-program", "x")
        assert (argv.returncode, argv.stdout) == (127, ""), argv.stderr
        assert argv.stderr == "no-such-program: command not found\n"
        shell = up_cluster.adx("env", "exec", env["id"], "--shell", "--", "no-such-program")
        assert shell.returncode == 127 and "not found" in shell.stderr, shell.stderr
        import adx

        key = json.loads((up_cluster.state / "credentials.json").read_text())["api_key"]
        with adx.Client(
            api_url=json.loads((up_cluster.state / "cluster.json").read_text())["api_url"], api_key=key
        ) as c:
            target = c.environments.get(env["id"])
            seen: list[str] = []
            by_list = target.commands.run(["no-such-program"], on_stderr=seen.append)
            by_string = target.commands.run("no-such-program")
            not_executable = target.commands.run(["/etc/hostname"])
        says = "no-such-program: command not found\n"
        assert (by_list.exit_code, by_list.stderr, seen) == (127, says, [says])
        assert by_string.exit_code == 127 and "not found" in by_string.stderr
        assert not_executable.exit_code == 126 and not_executable.stderr == "/etc/hostname: Permission denied\n"
    finally:
        deleted = up_cluster.adx("env", "delete", env["id"], "--wait")
        assert deleted.returncode == 0, deleted.stderr


def test_input_and_reachability_errors_name_the_value_the_url_and_the_fix(up_cluster: UpCluster) -> None:
    from adx.embedded._process import pick_free_port

    ambiguous = up_cluster.adx("env", "create", "--memory", "512m")
    assert ambiguous.returncode == 2
    assert "--memory: unit 'm' in '512m' is ambiguous: write Mi" in ambiguous.stderr, ambiguous.stderr
    negative = up_cluster.adx("env", "create", "--cpu=-1")
    assert negative.returncode == 2 and negative.stderr == "adx: error: --cpu: must not be negative, got -1\n"
    url = f"http://127.0.0.1:{pick_free_port('127.0.0.1')}"
    away = up_cluster.adx("env", "list", ADX_API_URL=url)
    assert away.returncode == 5, away.stderr
    assert f"cannot reach the ADX API at {url}" in away.stderr and "is the server running" in away.stderr


def test_a_hand_started_api_server_joins_the_recorded_cluster(up_cluster: UpCluster) -> None:
    """`adx api` with nothing but a listen address takes the Coordinator and certificates of the recorded cluster
    (a second API replica, as docs/cli.md says) and serves that cluster's tenants."""
    import httpx

    from adx.embedded._process import pick_free_port

    port = pick_free_port("127.0.0.1")
    log = (up_cluster.root / "api2.log").open("w")
    proc = subprocess.Popen(
        [*ADX, "api"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=up_cluster.env(ADX_API__LISTEN=f"127.0.0.1:{port}"),
        cwd=up_cluster.root,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (up_cluster.root / "api2.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (up_cluster.root / "api2.log").read_text()
            time.sleep(0.2)
        listed = up_cluster.adx("env", "list", "--json", "--api-url", f"http://127.0.0.1:{port}")
        assert listed.returncode == 0, listed.stderr
        assert "environments" in json.loads(listed.stdout)
        assert "joining the recorded cluster" in (up_cluster.root / "api2.log").read_text()
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
