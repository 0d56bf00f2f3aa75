"""Admin commands on a real ``adx up`` (issue 17's must-show): ``adx tenant create alice``, ``adx node list``,
``adx cluster status`` work with no flag from another directory, with the admin key ``adx up`` made and saved;
tenants, keys and cordons through the CLI."""

from __future__ import annotations

import json
import re

from cli_helpers import UpCluster


def test_up_makes_the_admin_key_once_and_saves_it_beside_the_credentials(up_cluster: UpCluster) -> None:
    saved = json.loads((up_cluster.state / "admin.json").read_text())
    user = json.loads((up_cluster.config_home / "adx" / "admin.json").read_text())
    assert saved == user and saved["admin_key"].startswith("adxa_")
    for path in (up_cluster.state / "admin.json", up_cluster.config_home / "adx" / "admin.json"):
        assert path.stat().st_mode & 0o777 == 0o600
    printed = up_cluster.out.read_text()
    assert f"Admin key {saved['admin_key']}" in printed


def test_must_show_tenant_node_and_cluster_commands_with_no_flag(up_cluster: UpCluster) -> None:
    created = up_cluster.adx("tenant", "create", "alice")
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip().startswith("adxk_")

    nodes = up_cluster.adx("node", "list")
    assert nodes.returncode == 0, nodes.stderr
    header, row = nodes.stdout.splitlines()[:2]
    assert header.split()[:3] == ["NAME", "HEALTH", "ADMISSION"]
    assert re.search(r"\bready\b", row) and re.search(r"\bopen\b", row)
    assert re.search(r"\d+(\.\d)?[KMGT]i/\d+(\.\d)?[KMGT]i", row), row  # human units, free/capacity
    assert re.search(r"\d+(\.\d)?s ago", row), row  # the last heartbeat's age

    as_json = json.loads(up_cluster.adx("node", "list", "--json").stdout)
    node = as_json[0]
    assert node["capacity"]["cpuMillis"] > 0 and node["allocatable"]["memoryBytes"] > 0

    status = up_cluster.adx("cluster", "status")
    assert status.returncode == 0, status.stderr
    assert "Coordinator  replica" in status.stdout
    assert re.search(r"Nodes\s+1 \(1 ready, 0 cordoned\)", status.stdout), status.stdout
    assert node["name"] in status.stdout


def test_tenants_and_keys_through_the_cli(up_cluster: UpCluster) -> None:
    key = up_cluster.adx("tenant", "create", "dora").stdout.strip()
    listed = up_cluster.adx("tenant", "list")
    assert listed.returncode == 0, listed.stderr
    line = next(line for line in listed.stdout.splitlines() if line.startswith("dora "))
    assert "enabled" in line and re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", line), line
    key_id = json.loads(up_cluster.adx("tenant", "list", "--json").stdout)
    dora = next(t for t in key_id if t["name"] == "dora")
    first_id = dora["keys"][0]["id"]

    disabled = up_cluster.adx("tenant", "disable", "dora")
    assert disabled.returncode == 0 and "its Environments are left" in disabled.stdout
    refused = up_cluster.adx("env", "list", ADX_API_KEY=key)
    assert refused.returncode == 7 and "tenant dora is disabled" in refused.stderr, refused.stderr
    assert up_cluster.adx("tenant", "enable", "dora").returncode == 0
    assert up_cluster.adx("env", "list", ADX_API_KEY=key).returncode == 0

    second = up_cluster.adx("key", "create", "dora")
    assert second.returncode == 0 and second.stdout.strip().startswith("adxk_")
    rotated = up_cluster.adx("key", "rotate", "dora", first_id)
    assert rotated.returncode == 0, rotated.stderr
    new_key = rotated.stdout.strip()
    assert f"key {first_id} replaced by key_" in rotated.stderr
    assert up_cluster.adx("env", "list", ADX_API_KEY=key).returncode == 7
    assert up_cluster.adx("env", "list", ADX_API_KEY=new_key).returncode == 0
    missing = up_cluster.adx("key", "revoke", "dora", first_id)
    assert missing.returncode == 3 and f"no key {first_id}" in missing.stderr

    # A tenant key in place of the admin key: refused, saying which key to use.
    wrong = up_cluster.adx("tenant", "list", "--admin-key", new_key)
    assert wrong.returncode == 7, wrong.stderr
    assert "tenant dora, not the admin key" in wrong.stderr and "admin.json" in wrong.stderr


def test_cordon_and_uncordon_through_the_cli(up_cluster: UpCluster) -> None:
    name = json.loads(up_cluster.adx("node", "list", "--json").stdout)[0]["name"]
    cordoned = up_cluster.adx("node", "cordon", name)
    assert cordoned.returncode == 0, cordoned.stderr
    try:
        row = up_cluster.adx("node", "list").stdout.splitlines()[1]
        assert "cordoned" in row
        status = up_cluster.adx("cluster", "status").stdout
        assert "1 cordoned" in status
        unknown = up_cluster.adx("node", "cordon", "nosuchnode")
        assert unknown.returncode == 3 and "node nosuchnode not found" in unknown.stderr
    finally:
        assert up_cluster.adx("node", "uncordon", name).returncode == 0
    assert re.search(r"\bopen\b", up_cluster.adx("node", "list").stdout.splitlines()[1])


def test_drain_through_the_cli_on_a_real_cluster(up_cluster: UpCluster) -> None:
    """`adx node drain` on `adx up` (every daemon a real process): the running Environment is paused with its
    files; its checkpoint is local (one node), which its line says; after the uncordon it resumes there."""
    made = up_cluster.adx("env", "create", "--cpu", "250m", "--memory", "128Mi", "--json")
    assert made.returncode == 0, made.stderr
    env = json.loads(made.stdout)
    wrote = up_cluster.adx("env", "exec", env["id"], "--", "sh", "-c", "echo drained-ok > /work/f")
    assert wrote.returncode == 0, wrote.stderr
    drained = up_cluster.adx("node", "drain", env["node"])
    try:
        assert drained.returncode == 0, drained.stdout + drained.stderr
        lines = drained.stdout.splitlines()
        assert lines[0].startswith("cordoned") and lines[-1].startswith("done")
        paused = next(line for line in lines if line.startswith("paused ") and env["id"] in line)
        assert "it resumes only there (uncordon it)" in paused
        state = json.loads(up_cluster.adx("env", "get", env["id"], "--json").stdout)["state"]
        assert state == "paused"
    finally:
        assert up_cluster.adx("node", "uncordon", env["node"]).returncode == 0
    read = up_cluster.adx("env", "exec", env["id"], "--", "cat", "/work/f")
    assert read.returncode == 0 and read.stdout.strip() == "drained-ok", read.stderr
    up_cluster.adx("env", "delete", env["id"])
