"""How E2B's template steps (the body the real SDK sends) map onto ADX builder steps, without building: FROM names,
per-step users, COPY sources/owner/mode, ``force``, and errors naming the field."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from apistack import api_stack  # noqa: F401  (fixture)
from e2b import Template

import adx.e2b
from adx.api import CoordinatorClient
from adx.e2b._template_steps import BuildStart, base_image, to_instructions
from adx.e2b._template_store import BuildRecord, BuildStatus, TemplateStore
from adx.errors import InvalidInputError
from adx.images import ImageManifest, ImageStore, Op
from adx.model import parse_wire


def _store(tmp_path: Path, *names: str) -> ImageStore:
    store = ImageStore(tmp_path / "store").ensure()
    for name in names:
        store.put(ImageManifest(name=name, layers=[], user="user", created_at=time.time()))
    return store


def _start(template: Template) -> BuildStart:
    """What ``Template.build`` posts to ``/v2/templates/{id}/builds/{buildID}``."""
    body = template._template._serialize(template._template._instructions_with_hashes())
    jsonschema.validate(json.loads(json.dumps(body)), _schema("TemplateBuildStart"))  # what wire/ says it is
    return parse_wire(BuildStart, body)


def _schema(name: str) -> dict[str, Any]:
    defs = json.loads((Path(adx.e2b.__file__).parent / "wire" / "control.schema.json").read_text())["$defs"]
    return {"$ref": f"#/$defs/{name}", "$defs": defs}


def test_from_names_map_to_store_images_and_unpullable_ones_are_refused_by_name(tmp_path: Path) -> None:
    store = _store(tmp_path, "mine")
    assert base_image(_start(Template().from_base_image().run_cmd("true")), store) == "debian"
    assert base_image(_start(Template().from_debian_image("bookworm").run_cmd("true")), store) == "debian"
    assert base_image(_start(Template().from_image("mine").run_cmd("true")), store) == "mine"
    assert base_image(_start(Template().from_template("mine").run_cmd("true")), store) == "mine"
    _store(tmp_path, "base")
    assert base_image(_start(Template().from_base_image().run_cmd("true")), store) == "base"
    for image in ("python:3", "debian:stable", "ghcr.io/acme/tool:1", "mine:v2", "Mine", "acme/tool"):
        with pytest.raises(InvalidInputError) as refused:
            base_image(_start(Template().from_image(image).run_cmd("true")), store)
        assert refused.value.field == "fromImage" and repr(image) in refused.value.message
        assert "registry" in refused.value.message
    private = Template().from_image("mine", username="u", password="p").run_cmd("true")
    with pytest.raises(InvalidInputError, match="private registry"):
        base_image(_start(private), store)
    with pytest.raises(InvalidInputError) as missing:
        base_image(_start(Template().from_template("nothing").run_cmd("true")), store)
    assert missing.value.field == "fromTemplate"


def test_steps_keep_their_sdk_numbers_users_and_copy_options(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    template = (
        Template(file_context_path=tmp_path)
        .from_base_image()
        .pip_install("rich")  # the SDK runs global installs as root
        .run_cmd("echo hi")
        .copy("a.txt", "/opt/", user="user:user", mode=0o640)
        .set_envs({"K": "V"})
        .set_workdir("/opt")
        .set_user("root")
    )
    start = _start(template)
    files_hash = start.steps[2].files_hash
    assert files_hash
    blob = "f" * 64
    (tmp_path / "ctx" / blob).mkdir(parents=True)
    (tmp_path / "ctx" / blob / "a.txt").write_text("a")
    steps = to_instructions(start, "debian", "user", {files_hash: blob}, tmp_path / "ctx", "build-1")
    assert [(s.op, s.line) for s in steps] == [
        (Op.FROM, 0),
        (Op.USER, 0),  # E2B builds as the base image's user
        (Op.RUN, 1),
        (Op.RUN, 2),
        (Op.COPY, 3),
        (Op.ENV, 4),
        (Op.WORKDIR, 5),
        (Op.USER, 6),
    ]
    assert (steps[2].args, steps[2].user) == (("pip install rich",), "root")
    assert steps[3].user is None
    assert (steps[4].args, steps[4].user, steps[4].mode) == ((f"{blob}/a.txt", "/opt/"), "user:user", 0o640)
    assert steps[5].args == ("K", "V")


def test_force_salts_the_keys_from_that_step_and_bad_steps_name_their_field(tmp_path: Path) -> None:
    start = _start(Template().from_base_image().run_cmd("echo 1").skip_cache().run_cmd("echo 2"))
    steps = to_instructions(start, "debian", "root", {}, tmp_path, "build-7")
    assert [s.op for s in steps] == [Op.FROM, Op.RUN, Op.ARG, Op.RUN]
    assert steps[2].args == ("ADX_E2B_FORCE_BUILD", "build-7")

    def refused(body: dict[str, object]) -> InvalidInputError:
        with pytest.raises(InvalidInputError) as raised:
            to_instructions(parse_wire(BuildStart, body), "debian", "root", {}, tmp_path, "b")
        return raised.value

    assert refused({"steps": [{"type": "EXPOSE", "args": ["80"]}]}).field == "steps[0].type"
    assert refused({"steps": [{"type": "RUN", "args": []}]}).field == "steps[0].args"
    assert refused({"steps": [{"type": "ENV", "args": ["K"]}]}).field == "steps[0].args"
    assert refused({"steps": [{"type": "COPY", "args": ["a", "/b"], "filesHash": "0" * 64}]}).field == (
        "steps[0].filesHash"
    )
    # A source pattern cannot climb out of its own upload into another one (another tenant's, say).
    (tmp_path / ("0" * 64)).mkdir()
    escape = {"type": "COPY", "args": [f"../{'0' * 64}/x", "/b"], "filesHash": "1" * 64}
    with pytest.raises(InvalidInputError, match="leaves the build context"):
        to_instructions(
            parse_wire(BuildStart, {"steps": [escape]}), "debian", "root", {"1" * 64: "2" * 64}, tmp_path, "b"
        )
    with pytest.raises(InvalidInputError) as unknown:
        parse_wire(BuildStart, {"steps": [], "fromDockerfile": "x"})
    assert unknown.value.field == "fromDockerfile"


async def test_an_api_server_without_a_builder_answers_501_in_e2b_shape(
    api_stack: Callable[..., Awaitable[Any]],  # noqa: F811
) -> None:
    """No ``images_dir``/``image_build_socket``: template routes say so (501), the SDK raises its exception."""
    stack = await api_stack()
    key = await stack.tenant("tpl-501")
    async with httpx.AsyncClient(base_url=stack.url, headers={"X-API-KEY": key}) as client:
        for method, path in [
            ("POST", "/v3/templates"),
            ("GET", "/templates/aliases/x"),
            ("GET", "/templates/x/files/y"),
            ("GET", "/templates"),
            ("GET", "/templates/x"),
            ("GET", "/templates/x/tags"),
            ("POST", "/templates/tags"),
        ]:
            body = {"name": "x", "target": "x", "tags": ["t"]} if method == "POST" else None
            answer = await client.request(method, path, json=body)
            assert answer.status_code == 501, (path, answer.text)
            assert answer.json()["code"] == 501 and "image_build_socket" in answer.json()["message"]


async def test_a_build_whose_api_server_died_reads_as_interrupted(
    api_stack: Callable[..., Awaitable[Any]],  # noqa: F811
    tmp_path: Path,
) -> None:
    """A build left ``building`` by an API process that is gone (same host) is reported as an error, so the SDK's
    wait ends instead of polling forever; another tenant's status call is a 404."""
    stack = await api_stack(images_dir=tmp_path)
    key = await stack.tenant("tpl-dead")
    other = await stack.tenant("tpl-other")
    templates = TemplateStore(tmp_path / "e2b-templates")
    gone = await asyncio.create_subprocess_exec("true")
    await gone.wait()
    coordinator = CoordinatorClient.from_config(stack.config)
    try:
        tenant = await coordinator.authenticate(key)
    finally:
        await coordinator.close()
    owner = f"{socket.gethostname()}:{gone.pid}"  # an ended process of this host
    build = BuildRecord(id="b-1", template="t", tenant=tenant, created_at=time.time(), owner=owner)
    build.status = BuildStatus.BUILDING
    templates.put_build(build)
    async with httpx.AsyncClient(base_url=stack.url) as client:
        answer = await client.get("/templates/t/builds/b-1/status", headers={"X-API-KEY": key})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["status"] == "error" and "interrupted" in body["reason"]["message"], body
        jsonschema.validate(body, _schema("TemplateBuildInfo"))
        foreign = await client.get("/templates/t/builds/b-1/status", headers={"X-API-KEY": other})
        assert foreign.status_code == 404, foreign.text
