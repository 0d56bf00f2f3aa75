"""The Environment's ``image`` and E2B's ``templateID`` name images of the nodes' store (issue 13): an image the
store lacks is a 422 naming the field, before anything is stored; a known one and ``base`` are accepted."""

from __future__ import annotations

from pathlib import Path

import httpx
from apistack import ApiStack

from adx.images import ImageManifest, ImageStore, layer_digest

SPEC = {"resources": {"cpuMillis": 500, "memoryBytes": 256 * 2**20}}


def _store_with(tmp_path: Path, name: str) -> Path:
    store = ImageStore(tmp_path / "images" / "store").ensure()
    digest = layer_digest(None, "RUN x")
    staging = store.staging()
    (staging / "tree" / "etc").mkdir()
    store.commit_layer(staging, digest, None, "RUN x")
    store.put(ImageManifest(name=name, layers=[digest]))
    return tmp_path / "images"


async def test_unknown_image_and_template_are_422_naming_the_field(api_stack, tmp_path: Path) -> None:
    stack: ApiStack = await api_stack(images_dir=_store_with(tmp_path, "mine"))
    key = await stack.tenant("acme")
    await stack.register_node("n1")
    async with stack.http(key) as http:
        refused = await http.post("/v1/environments", json={**SPEC, "image": "nope"})
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["details"]["field"] == "image" and "nope" in error["message"]
        assert (await http.get("/v1/environments")).json()["environments"] == []  # nothing was stored
        for image in ("mine", "base"):
            created = await http.post("/v1/environments", json={**SPEC, "image": image})
            assert created.status_code == 201, created.text
            assert created.json()["image"] == image
    async with httpx.AsyncClient(base_url=stack.url, headers={"X-API-Key": key}) as e2b:
        refused = await e2b.post("/v2/sandboxes", json={"templateID": "nope"})
        assert 400 <= refused.status_code < 500 and "templateID" in refused.text, refused.text
