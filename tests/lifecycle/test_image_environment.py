"""An Environment from a store image on the real stack (issue 13): SDK -> API server -> Coordinator -> adxlet ->
sandboxd -> execd. It runs as the image's ``user`` in ``/home/user`` with sudo working, and after pause and resume
its files in ``/home/user`` and ``/etc`` (written with sudo) are there; an unknown image is a 422 naming
``image`` before anything is created.

The Debian image comes from the store tests/sandboxd/test_images.py builds (``ADX_TEST_IMAGE_CACHE``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from apistack import ApiStack

import adx
from adx.errors import InvalidInputError
from adx.images import ImageStore, ensure_debian_image

CACHE = Path(os.environ.get("ADX_TEST_IMAGE_CACHE", "/var/tmp/adx-test-images"))

pytestmark = pytest.mark.slow


async def test_environment_from_the_debian_image_runs_as_user_with_sudo_and_keeps_files(node_cluster, api_for) -> None:
    ensure_debian_image(ImageStore(CACHE / "store").ensure(), progress=print)  # found, or built once (minutes)
    nc = await node_cluster(sandboxd_config={"images_dir": str(CACHE)})
    stack: ApiStack = await api_for(nc.cluster, images_dir=CACHE)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        with pytest.raises(InvalidInputError) as refused:
            await client.environments.create(cpu=0.25, memory="256Mi", image="no-such-image")
        assert refused.value.field == "image"
        env = await client.environments.create(
            cpu=1, memory="512Mi", image="debian", pause=adx.PausePolicy(retention=adx.Retention.forever())
        )
        who = await env.commands.run("id -un; pwd; sudo -n id -u; echo mine > ~/notes.txt; echo x | sudo tee /etc/x")
        assert who.exit_code == 0 and who.stdout == "user\n/home/user\n0\nx\n", who
        await env.pause()
        await env.resume()
        again = await env.commands.run("cat /home/user/notes.txt /etc/x; stat -c %U /home/user/notes.txt")
        assert again.stdout == "mine\nx\nuser\n", again
        await env.delete()
