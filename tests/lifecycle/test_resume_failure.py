"""A resume the node accepts and then fails (its checkpoint cannot be restored) is answered, not retried in a
tight loop: the waking request gets a prompt error naming the failure, and the Coordinator does not hand the
same failing resume to the node again and again (CRD-5: a refusal starts a capacity round, not a spin)."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import pytest
from apistack import ApiStack

import adx
from adx.errors import AdxError


@pytest.mark.req("CRD-5")
async def test_a_resume_that_fails_on_the_node_is_answered_promptly_and_not_spun(
    node_cluster, api_for, caplog: pytest.LogCaptureFixture
) -> None:
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.25, memory="256Mi")
        await env.commands.run("echo kept > /work/f")
        paused = await env.pause()
        assert paused.checkpoint is not None and paused.checkpoint.storage == "local"
        # The checkpoint's files go missing behind the platform's back: every restore of it fails on the node.
        shutil.rmtree(Path(paused.checkpoint.location))
        caplog.set_level(logging.INFO, logger="adx")
        started = time.monotonic()
        with pytest.raises(AdxError) as failure:
            await env.commands.run("cat /work/f")
        took = time.monotonic() - started
        handed_over = [r for r in caplog.records if r.getMessage() == "resume intent recorded"]
        assert took < 20, f"the waking request waited {took:.1f}s for a resume that had failed"
        assert "resume failed" in str(failure.value), failure.value
        assert len(handed_over) <= 2, f"the failing resume was handed to the node {len(handed_over)} times"
        await env.delete()
