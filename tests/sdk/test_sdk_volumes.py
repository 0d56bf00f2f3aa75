"""``client.volumes`` and ``environments.create(volumes=...)`` (docs/volumes.md, docs/sdk.md) against a real API
server and Coordinator: sync and async twins, the SDK's own error types."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from apistack import ApiStack, free_port

import adx


async def test_sdk_volumes_async_and_sync(api_stack, tmp_path: Path) -> None:
    stack: ApiStack = await api_stack(volumes_dir=tmp_path / "volumes")
    key = await stack.tenant("acme")
    await stack.register_node("n1")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        data = await client.volumes.create("data")
        assert data.id.startswith("vol-") and data.name == "data"
        assert [v.id for v in await client.volumes.list()] == [data.id]
        assert (await client.volumes.get(data.id)) == data
        with pytest.raises(adx.ConflictError):
            await client.volumes.create("data")
        env = await client.environments.create(cpu=0.5, memory="256Mi", volumes={"/mnt/data": data}, wait=False)
        assert [(m.name, m.path) for m in env.volumes] == [("data", "/mnt/data")]
        with pytest.raises(adx.ConflictError, match=env.id):
            await client.volumes.delete(data)
        with pytest.raises(adx.InvalidInputError) as unknown:
            await client.environments.create(cpu=0.5, memory="256Mi", volumes={"/x": "nope"}, wait=False)
        assert unknown.value.field == "volumes[0].name"

    def sync_part() -> None:
        with adx.Client(api_url=stack.url, api_key=key) as client:
            other = client.volumes.create("other")
            assert [v.name for v in client.volumes.list()] == ["data", "other"]
            assert client.volumes.get(other).id == other.id
            assert client.volumes.delete(other.id).name == "other"
            with pytest.raises(adx.NotFoundError):
                client.volumes.get(other.id)

    await asyncio.to_thread(sync_part)


def test_bad_volume_mounts_are_refused_before_any_request() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: an InvalidInputError proves nothing was sent
    with adx.Client(api_url=url, api_key="k", retries=0) as client:
        for volumes, field in (({"relative": "data"}, "volumes[0].path"), ({"/d": "no/slash"}, "volumes[0].name")):
            with pytest.raises(adx.InvalidInputError) as caught:
                client.environments.create(volumes=volumes)
            assert caught.value.field == field
