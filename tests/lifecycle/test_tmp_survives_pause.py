"""Files an agent writes in ``/tmp`` survive pause and resume on the real stack (issue 13: ``/tmp`` was a tmpfs no
checkpoint captured, so ``files.write("/tmp/acc.txt")``, pause, resume lost the file while ``/work`` kept its).

SDK -> API server -> Coordinator -> adxlet -> sandboxd (filesystem checkpoint of the writable layer) -> execd."""

from __future__ import annotations

import pytest
from apistack import ApiStack

import adx


@pytest.mark.req("CRD-1", "ENV-3")
async def test_tmp_and_var_tmp_files_survive_pause_and_resume(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(
            cpu=0.25, memory="256Mi", pause=adx.PausePolicy(retention=adx.Retention.forever())
        )
        await env.files.write("/tmp/acc.txt", b"account 42")
        await env.files.write("/var/tmp/cache.txt", b"cached")
        await env.files.write("/work/kept.txt", b"kept")
        written = await env.commands.run("head -c 1048576 /dev/urandom > /tmp/blob && sha256sum /tmp/blob")
        assert written.exit_code == 0, written
        executions = {env.execution_id}
        for cycle in range(1, 4):
            await env.pause()
            assert env.state == "paused" and env.execution_id is None
            await env.resume()
            assert env.state == "running" and env.execution_id not in executions
            executions.add(env.execution_id)
            assert await env.files.read("/tmp/acc.txt") == b"account 42", f"cycle {cycle}"
            assert await env.files.read("/var/tmp/cache.txt") == b"cached"
            assert await env.files.read("/work/kept.txt") == b"kept"
            again = await env.commands.run("sha256sum /tmp/blob; stat -c %a /tmp")
            assert again.stdout == f"{written.stdout}1777\n", again
        await env.delete()
