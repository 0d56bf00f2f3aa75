"""The spawn spec crosses three process boundaries as JSON: what one side writes, the next reads back whole."""

from __future__ import annotations

import json
from dataclasses import asdict

from adx.sandboxd._spawn_spec import Limits, SpawnSpec, UserNamespace, Veth


def _spec(**changes: object) -> SpawnSpec:
    base = SpawnSpec(
        sandbox_id="sb-1",
        sandbox_dir="/state/sandboxes/sb-1",
        image_root="/layers/b:/layers/a",
        image_binds=["/usr", "/lib"],
        init_argv=["python3", "-m", "adx.execd"],
        env={"PATH": "/usr/bin", "HOME": "/root"},
        cwd="/work",
        hostname="sb-1",
        network="veth",
        cgroup_parent="adx",
        resources=Limits(cpu_millis=250, memory_bytes=128 << 20, pids_max=512, disk_bytes=1 << 30),
        log_dir="/state/logs/g",
        log_segment_bytes=1 << 20,
        log_max_bytes=8 << 20,
        run_dir="/state/sandboxes/sb-1/run",
        ro_binds={"/opt/adx": "/state/runtime"},
        veth=Veth(host_if="adxv0123456789", host_ip="10.88.0.1", sandbox_ip="10.88.0.2"),
        execd_sockets="/state/sandboxes/sb-1/sockets",
        control_dir="/state/sandboxes/sb-1/control",
        userns=UserNamespace(base=100_000, size=65_536),
        execd_inproc=True,
    )
    return SpawnSpec.from_wire({**asdict(base), **changes}) if changes else base


def test_a_spawn_spec_survives_its_json_hops_whole() -> None:
    spec = _spec()
    assert spec.to_wire() == asdict(spec)  # the shallow wire form says what the deep one says
    line = json.dumps({"req": 7, "spec": spec.to_wire()})  # sandboxd -> spawner
    hop1 = SpawnSpec.from_wire(json.loads(line)["spec"])
    hop2 = SpawnSpec.from_json(hop1.to_json())  # spawner -> zygote -> prepared init
    assert hop2 == spec
    assert isinstance(hop2.resources, Limits) and isinstance(hop2.veth, Veth) and isinstance(hop2.userns, UserNamespace)
    assert hop2.veth.sandbox_ip == "10.88.0.2" and hop2.userns.base == 100_000


def test_the_optional_parts_come_back_as_none() -> None:
    spec = _spec(veth=None, userns=None, execd_sockets=None, control_dir=None, network="none")
    back = SpawnSpec.from_json(spec.to_json())
    assert (
        back == spec and back.veth is None and back.userns is None and back.ro_binds == {"/opt/adx": "/state/runtime"}
    )
