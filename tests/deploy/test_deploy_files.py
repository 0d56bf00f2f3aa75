"""deploy/: the systemd units pass ``systemd-analyze verify`` (no warning either), the Kubernetes manifests pass
kubernetes-validate's strict schema check, and every daemon configuration they load is a valid ADX model."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import ValidationError

from adx.config import CoordinatorConfig, NodeConfig, load_model
from adx.gateway import ApiConfig
from adx.sandboxd import SandboxdConfig

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))
K8S_VERSION = "1.37"
MODELS = {"coordinator": CoordinatorConfig, "api": ApiConfig, "sandboxd": SandboxdConfig, "node": NodeConfig}
# What the units and manifests set per machine through the environment (docs/deploy.md).
PER_MACHINE = {"node": {"ADX_NODE__NAME": "m1"}}


def _adx() -> str:
    return str(Path(sys.executable).with_name("adx"))


def _verify(unit_dir: Path) -> subprocess.CompletedProcess[str]:
    # The units' own directory first on the search path: BindsTo=adx-sandboxd.service must resolve to ours.
    return subprocess.run(
        ["systemd-analyze", "verify", *sorted(str(p) for p in unit_dir.glob("*.service"))],
        capture_output=True,
        text=True,
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{unit_dir}:"},
        timeout=60,
    )


def _installed_units(tmp_path: Path, edit: str = "") -> Path:
    """The units as installed on a machine: ExecStart's /opt/adx/bin/adx is this checkout's adx (verify checks
    that the program exists)."""
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    for unit in UNITS:
        text = unit.read_text().replace("/opt/adx/bin/adx", _adx())
        if edit and unit.name == "adx-api.service":
            text = text.replace("KillSignal=", edit)
        (unit_dir / unit.name).write_text(text)
    return unit_dir


def test_there_is_a_unit_for_every_daemon() -> None:
    names = {unit.name for unit in UNITS}
    daemons = {"sandboxd", "node", "coordinator", "api", "ingress", "agent-worker@", "agent-maintenance"}
    assert names == {f"adx-{d}.service" for d in daemons}
    for unit in UNITS:
        text = unit.read_text()
        assert "ExecStart=/opt/adx/bin/adx " in text and "Restart=always" in text, unit.name
    # sandboxes outlive sandboxd (their supervisors are re-parented): a restart must not kill the unit's cgroup
    assert "KillMode=process" in (DEPLOY / "systemd" / "adx-sandboxd.service").read_text()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze (Debian package systemd)")
def test_systemd_units_verify_without_a_warning(tmp_path: Path) -> None:
    result = _verify(_installed_units(tmp_path))
    assert result.returncode == 0 and result.stderr == "" and result.stdout == "", result.stderr + result.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze (Debian package systemd)")
def test_systemd_verify_catches_a_misspelt_key(tmp_path: Path) -> None:
    """The check above can fail: an unknown key is a warning on stderr (exit status 0), which it refuses."""
    result = _verify(_installed_units(tmp_path, edit="KilSignal="))
    assert "Unknown key 'KilSignal'" in result.stderr


def _documents() -> list[tuple[str, dict[str, object]]]:
    docs = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return docs


def test_kubernetes_manifests_pass_the_strict_schema_check() -> None:
    docs = _documents()
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _, doc in docs}
    assert {("Deployment", "adx-coordinator"), ("Deployment", "adx-api"), ("DaemonSet", "adx-node")} <= kinds
    for where, doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises naming the field
        assert doc["metadata"].get("namespace", "adx") == "adx", where
    daemonset = next(doc for _, doc in docs if doc["kind"] == "DaemonSet")
    containers = {c["name"]: c for c in daemonset["spec"]["template"]["spec"]["containers"]}  # type: ignore[index]
    assert set(containers) == {"sandboxd", "adxlet"}
    assert containers["sandboxd"]["securityContext"]["privileged"] is True


def test_the_schema_check_refuses_a_wrong_field() -> None:
    _, doc = next((w, d) for w, d in _documents() if d["kind"] == "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(doc))
    broken["spec"]["replica"] = 2  # misspelt
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def _check_config(component: str, text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / f"{component}.toml"
    path.write_text(text)
    for key, value in PER_MACHINE.get(component, {}).items():
        monkeypatch.setenv(key, value)
    load_model(MODELS[component], component, path)  # raises naming the key


@pytest.mark.parametrize("component", sorted(MODELS))
def test_the_configuration_files_are_valid(component: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check_config(component, (DEPLOY / "config" / f"{component}.toml").read_text(), tmp_path, monkeypatch)
    configmap = next(doc for _, doc in _documents() if doc["kind"] == "ConfigMap")
    _check_config(component, configmap["data"][f"{component}.toml"], tmp_path, monkeypatch)  # type: ignore[index]


def test_the_deployment_page_shows_what_the_three_machine_test_runs() -> None:
    """tests/deploy/test_three_machines.py follows docs/deploy.md: the commands and per-machine values it uses
    are the page's."""
    page = (DEPLOY.parent / "docs" / "deploy.md").read_text()
    for shown in (
        "adx certs init --dir ca",
        "adx certs issue main --kind coordinator --host 10.0.0.21 --host 10.0.0.22 --dir ca",
        "adx certs issue main --kind api --host 10.0.0.31 --host 10.0.0.32 --dir ca",
        "adx certs issue m1 --kind node --host 10.0.0.41 --dir ca",
        "replicaof 10.0.0.11 6379",
        "sentinel monitor adx 10.0.0.11 6379 2",
        "ADX_COORDINATOR__LISTEN=10.0.0.21:7401",
        "ADX_API__LISTEN=10.0.0.31:8080",
        "ADX_NODE__NAME=m1\nADX_NODE__LISTEN=10.0.0.41:7402\nADX_NODE__RELAY_LISTEN=10.0.0.41:7403",
        "adx config check /etc/adx/node.toml --component node",
        "adx key admin --config /etc/adx/api.toml",
        "adx tenant create alice --config /etc/adx/api.toml",
        "adx node list",
        "adx cluster status",
        "adx node drain m1",
    ):
        assert shown in page, shown
    for name in ("coordinator", "api", "sandboxd", "node"):
        assert f"deploy/config/{name}.toml" in page, name


def test_key_admin_names_the_field_it_refuses(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADX_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path)
    bad = subprocess.run([_adx(), "key", "admin", "--name", "no spaces"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "--name" in bad.stderr, bad.stderr
    lost = subprocess.run(
        [_adx(), "key", "admin", "--coordinator", "127.0.0.1:9", "--certs-dir", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert lost.returncode == 3 and "ca.pem not found" in lost.stderr and "--certs-dir" in lost.stderr, lost.stderr
