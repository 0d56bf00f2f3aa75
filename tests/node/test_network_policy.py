"""An Environment's network policy end to end: SDK -> API -> Coordinator (a spec revision) -> the owning node
applies it in place on the running sandbox (no restart) and publishes the applied revision (NOD-10)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from apistack import start_api
from fake_internet import PROBE, FakeInternet
from process_cluster import record_of, wait_for

import adx
from adx.model import EnvironmentRecord, EnvironmentSpec, EnvironmentState, NetworkPolicy, Resources
from adx.node._journal import PendingResult, spec_digest
from adx.node._replay import _resolve
from adx.sandboxd import SandboxdClient


def _tenant(api: Any) -> Any:
    async def make() -> str | None:
        try:
            return str(await api.tenant("acme"))
        except adx.errors.AdxError:
            return None

    return make


async def _probe(cluster: Any, env_id: str, host: FakeInternet) -> str:
    status, stdout, body = await cluster.run("n1", env_id, ["python3", "-c", PROBE, host.address, str(host.port)])
    assert status == 200, body
    return stdout.strip()


@pytest.mark.req("NOD-10")
async def test_policy_switch_through_the_api_takes_effect_on_the_running_environment(
    process_cluster: Any,
    fake_internet: FakeInternet,
) -> None:
    cluster = process_cluster()
    api = await start_api(SimpleNamespace(certs=cluster.certs, target=cluster.coordinator_address))
    try:
        key = await wait_for(_tenant(api), 30, "the Coordinator to serve", interval=0.3)
        async with adx.AsyncClient(api_url=api.url, api_key=key) as client:

            async def create() -> Any:
                try:  # until the node has registered and reported capacity
                    return await client.environments.create(cpu=0.5, memory="256Mi", network={"mode": "egress"})
                except adx.errors.AdxError:
                    return None

            env = await wait_for(create, 60, "the node to take an Environment", interval=0.3)
            assert env.state == "running"
            out = await _probe(cluster, env.id, fake_internet)
            assert out.startswith("ok"), out
            async with SandboxdClient(cluster.nodes["n1"].sandboxd.socket) as sbx:
                (before,) = await sbx.list()

            with pytest.raises(adx.errors.AdxError, match=r"network\.deny\[0\]: not a CIDR or DNS name"):
                await env.set_network(deny=["not a host"])
            t0 = time.monotonic()
            await env.set_network(deny=[fake_internet.address])
            assert env.execution_id == before.sandbox_id  # the same execution: nothing restarted

            async def refused() -> bool:
                return (await _probe(cluster, env.id, fake_internet)).startswith("refused")

            await wait_for(refused, 15, "the deny list to take effect")
            switch_seconds = time.monotonic() - t0

            async def published() -> EnvironmentRecord | None:
                record = record_of(await cluster.redis_record(env.id))
                assert record is not None
                ok = record.network_applied_revision == record.network_revision > 0
                return record if ok else None

            record = await wait_for(published, 15, "the node to publish the applied network revision")
            assert record.state is EnvironmentState.RUNNING and record.spec.network is not None
            assert record.spec.network.deny == [f"{fake_internet.address}/32"]
            async with SandboxdClient(cluster.nodes["n1"].sandboxd.socket) as sbx:
                (after,) = await sbx.list()
            # Same sandbox, same cgroup, same init: applied in place.
            assert (after.sandbox_id, after.native) == (before.sandbox_id, before.native)
            assert after.network_policy == record.spec.network
            assert switch_seconds < 15

            # An allow list that leaves the test host out refuses it too; one that names it lets it through.
            await env.set_network(allow=["192.0.2.0/24"])
            await wait_for(refused, 15, "the narrow allow list to take effect")
            await env.set_network(allow=[fake_internet.address])

            async def reachable() -> bool:
                return (await _probe(cluster, env.id, fake_internet)).startswith("ok")

            await wait_for(reachable, 15, "the allow list naming the test host")

            # A paused Environment takes the new policy with its record and gets it when it resumes.
            await env.pause()
            await env.set_network(deny=[fake_internet.address])
            await env.resume()
            await env.wait_until_running(60)
            assert (await _probe(cluster, env.id, fake_internet)).startswith("refused")
            resumed = await wait_for(published, 15, "the resumed execution to publish the applied revision")
            assert resumed.execution_id != before.sandbox_id
            await env.delete()
    finally:
        await api.stop()


def _record(revision: int, network: NetworkPolicy | None, state: EnvironmentState) -> EnvironmentRecord:
    spec = EnvironmentSpec(resources=Resources(cpu_millis=100, memory_bytes=1 << 26), network=network)
    return EnvironmentRecord(
        id="env-1",
        tenant="t",
        spec=spec,
        state=state,
        node="n1",
        generation=1,
        revision=revision,
        execution_id="exe-1",
        created_at=0.0,
        updated_at=0.0,
    )


@pytest.mark.req("NOD-10")
def test_a_journaled_result_replays_over_a_network_change_instead_of_conflicting() -> None:
    """NOD-10: published state and revision are compared before the spec: a result journaled against the old
    network policy is rebased on the Coordinator's newer revision (same ownership, state and execution), not
    dropped as a spec conflict; a real spec change still is."""
    base = _record(3, None, EnvironmentState.RUNNING)
    entry = PendingResult(
        seq=1,
        env_id="env-1",
        generation=1,
        base_revision=3,
        base_state=EnvironmentState.RUNNING,
        base_execution_id="exe-1",
        state=EnvironmentState.PAUSING,
        execution_id="exe-1",
        changes={"state": "pausing"},
        release_reservation=False,
        spec_digest=spec_digest(base.spec),
        recorded_at=0.0,
    )
    changed_network = _record(4, NetworkPolicy.model_validate({"mode": "egress", "deny": ["10.0.0.0/8"]}), base.state)
    assert _resolve(entry, changed_network, "n1") == "rebase"
    changed_spec = changed_network.model_copy(
        update={"spec": changed_network.spec.model_copy(update={"entrypoint": ["sleep", "1"]})}
    )
    assert _resolve(entry, changed_spec, "n1") == "the request spec changed"
