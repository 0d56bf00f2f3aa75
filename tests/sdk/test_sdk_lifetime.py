"""The SDK's lifetime, pause and resume: argument checks before any request, the per-call pause timeout, and
the real stack (SDK -> API server + Ingress -> Coordinator (Redis) -> adxlet -> sandboxd -> execd)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from apistack import ApiStack, free_port

import adx
from adx.model import Lifecycle, PauseOptions
from adx.sdk._spec import PAUSE_OVERHEAD_SECONDS, lifetime_body, pause_call_timeout


async def wait_state(env: adx.AsyncEnvironment, state: str, within: float) -> float:
    """Polls until ``state``; returns when it was first seen (Unix time)."""
    deadline = time.monotonic() + within
    while (await env.refresh()).state != state:
        assert time.monotonic() < deadline, f"{env.id} is {env.state}, expected {state}"
        await asyncio.sleep(0.05)
    return time.time()


@pytest.mark.req("ENV-1", "ENV-5")
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"lifetime": 0}, "lifetime"),
        ({"lifetime": 2.5}, "lifetime"),
        ({"lifetime": True}, "lifetime"),
        ({"lifetime": 31 * 86_400}, "lifetime"),
        ({"lifetime": 60, "lifetime_action": "sleep"}, "lifetime_action"),
    ],
)
def test_bad_lifetime_is_refused_before_any_request(kwargs: dict[str, Any], field: str) -> None:
    # Nothing listens at this URL: an InvalidInputError (not UnavailableError) proves nothing was sent.
    url = f"http://127.0.0.1:{free_port()}"
    with adx.Client(api_url=url, api_key="k", retries=0) as client, pytest.raises(adx.InvalidInputError) as caught:
        client.environments.create(**kwargs)
    assert caught.value.field == field and str(caught.value).startswith(field)


@pytest.mark.req("ENV-1")
def test_lifetime_body_and_pause_call_timeout() -> None:
    assert lifetime_body(60) == {"seconds": 60}
    assert lifetime_body(60.0, adx.IdleAction.PAUSE) == {"seconds": 60, "action": "pause"}
    for seconds, action, field in [(0, None, "seconds"), (1.5, None, "seconds"), (10, "sleep", "action")]:
        with pytest.raises(adx.InvalidInputError) as caught:
            lifetime_body(seconds, action)
        assert caught.value.field == field
    # A pause may take as long as its capture bound (pauseOptions.timeoutSeconds, default 300) plus overhead.
    assert pause_call_timeout(Lifecycle(), 30.0) == 300 + PAUSE_OVERHEAD_SECONDS
    assert pause_call_timeout(Lifecycle(pause_options=PauseOptions(timeout_seconds=5)), 90.0) == 90.0
    assert pause_call_timeout(Lifecycle(pause_options=PauseOptions(timeout_seconds=900)), 30.0) == 960.0


@pytest.mark.req("ENV-1", "ENV-3", "CRD-3")
async def test_lifetime_deletes_or_pauses_and_set_lifetime_moves_it(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        start = time.time()
        doomed = await client.environments.create(cpu=0.25, memory="256Mi", lifetime=2)
        sleeper = await client.environments.create(cpu=0.25, memory="256Mi", lifetime=2, lifetime_action="pause")
        assert doomed.lifecycle.lifetime_seconds == 2 and doomed.lifecycle.lifetime_action == "delete"
        assert sleeper.lifecycle.lifetime_action == adx.IdleAction.PAUSE
        assert doomed.expires_at is not None and start + 1.5 < doomed.expires_at < time.time() + 2.5
        assert doomed.ownership_lost is False
        await sleeper.files.write("/work/kept.txt", b"kept")

        deadline = doomed.expires_at
        deleted_at = await wait_state(doomed, "deleted", within=20)
        await wait_state(sleeper, "paused", within=20)
        # Not before the deadline (2 s after creation); soon after it (the Coordinator scans every second).
        assert deadline <= deleted_at < deadline + 5
        assert sleeper.checkpoint is not None

        # The lifetime pause consumed the deadline (committed right after the pause); a resume starts a new
        # lifetime of the same length.
        consumed_by = time.monotonic() + 10
        while (await sleeper.refresh()).expires_at is not None:
            assert time.monotonic() < consumed_by, "the lifetime pause did not consume the deadline"
            await asyncio.sleep(0.05)
        before = time.time()
        await sleeper.resume()
        assert sleeper.state == "running"
        assert sleeper.expires_at is not None and before + 2 <= sleeper.expires_at <= time.time() + 2.5
        await sleeper.set_lifetime(600)
        assert sleeper.expires_at is not None and before + 599 <= sleeper.expires_at <= time.time() + 601
        assert await sleeper.files.read("/work/kept.txt") == b"kept"
        await sleeper.set_lifetime(1, action="delete")
        assert sleeper.lifecycle.lifetime_action == "delete"
        await wait_state(sleeper, "deleted", within=20)

        with pytest.raises(adx.InvalidInputError) as caught:
            await sleeper.set_lifetime(0)
        assert caught.value.field == "seconds"
        with pytest.raises(adx.ConflictError):
            await sleeper.set_lifetime(60)  # deleted: nothing to move

    def sync_part() -> None:
        with adx.Client(api_url=stack.url, api_key=key) as sync_client:
            env = sync_client.environments.create(cpu=0.25, memory="256Mi")
            assert env.expires_at is None
            assert env.set_lifetime(300, adx.IdleAction.PAUSE).expires_at is not None
            assert env.lifecycle.lifetime_action == "pause"
            assert env.pause().state == "paused" and env.checkpoint is not None
            assert env.resume().state == "running"
            assert env.commands.run("echo back").stdout == "back\n"
            env.delete()

    await asyncio.to_thread(sync_part)
