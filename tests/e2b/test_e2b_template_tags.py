"""E2B's template tags and template catalog through the real ``e2b`` SDK (sync and async) against ``adx up``:
``Template.build(t, "name:tag", tags=[...])``, ``Sandbox.create("name:tag")``, ``Template.assign_tags``,
``remove_tags``, ``get_tags``, and the API's ``GET /templates`` and ``GET /templates/{id}`` read with the SDK's own
generated client (so their answers have E2B's shape). A tag names one build of a template; a build that names no
tag gets ``default``, which ``name`` alone means."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from e2b import AsyncSandbox, AsyncTemplate, Sandbox, SandboxException, Template
from e2b.api.client.api.templates import get_templates, get_templates_template_id
from e2b.api.client.models import Template as TemplateView
from e2b.api.client.models import TemplateWithBuilds
from e2b.api.client_sync import get_api_client
from e2b.connection_config import ConnectionConfig
from e2b.exceptions import TemplateException
from e2b_up import Up, running_debian_up

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with running_debian_up(tmp_path_factory.mktemp("e2b-template-tags")) as running:
        yield running


def _writes(text: str) -> Template:
    return Template().from_base_image().run_cmd(f"echo {text} > /home/user/v.txt")


def _content(up: Up, template: str) -> str:
    sandbox = Sandbox.create(template, **up.opts())
    try:
        return str(sandbox.files.read("/home/user/v.txt")).strip()
    finally:
        sandbox.kill()


def test_tags_name_builds_and_sandboxes_start_the_tagged_one(up: Up) -> None:
    name = f"tpl-tags-{uuid.uuid4().hex[:8]}"
    first = Template.build(_writes("one"), f"{name}:v1", **up.opts())
    assert first.tags == ["v1"] and first.template_id == name
    assert [t.tag for t in Template.get_tags(name, **up.opts())] == ["v1"]
    client = get_api_client(ConnectionConfig(api_key=up.key, api_url=up.url))
    (row,) = [t for t in get_templates.sync(client=client) or [] if t.template_id == name]
    assert (row.build_id, row.build_status.value) == ("00000000-0000-0000-0000-000000000000", "waiting")
    with pytest.raises(SandboxException, match="not found"):  # no build has the default tag yet
        Sandbox.create(name, **up.opts())
    assert _content(up, f"{name}:v1") == "one"
    second = Template.build(_writes("two"), name, tags=["Stable", "stable"], **up.opts())
    assert second.tags == ["stable"]  # lowercased, once; tags given: no default
    third = Template.build(_writes("three"), name, **up.opts())
    assert third.tags == ["default"]
    assert (_content(up, name), _content(up, f"{name}:default")) == ("three", "three")
    assert (_content(up, f"{name}:stable"), _content(up, f"{name}:v1")) == ("two", "one")

    tags = {t.tag: t.build_id for t in Template.get_tags(name, **up.opts())}
    assert tags == {"v1": first.build_id, "stable": second.build_id, "default": third.build_id}
    assigned = Template.assign_tags(f"{name}:v1", ["prod", "canary"], **up.opts())
    assert (assigned.build_id, sorted(assigned.tags)) == (first.build_id, ["canary", "prod"])
    assert _content(up, f"{name}:prod") == "one"
    Template.assign_tags(f"{name}:stable", "prod", **up.opts())  # a tag moves
    assert _content(up, f"{name}:prod") == "two"
    Template.remove_tags(name, ["prod", "canary"], **up.opts())
    assert set({t.tag for t in Template.get_tags(name, **up.opts())}) == {"v1", "stable", "default"}
    with pytest.raises(SandboxException, match="not found"):
        Sandbox.create(f"{name}:prod", **up.opts())

    # E2B's refusals: the default tag stays, a tag of no build, another team's template, a missing one.
    with pytest.raises(TemplateException, match="default"):
        Template.remove_tags(name, "default", **up.opts())
    with pytest.raises(TemplateException, match="not found"):
        Template.assign_tags(f"{name}:nope", "x", **up.opts())
    with pytest.raises(TemplateException, match="access"):
        Template.assign_tags(f"{name}:v1", "mine", **up.opts(up.other_key))
    with pytest.raises(TemplateException, match="not found"):
        Template.get_tags(f"no-such-{name}", **up.opts())
    with pytest.raises(TemplateException, match="tag"):
        Template.assign_tags(f"{name}:v1", "not a tag!", **up.opts())

    # The catalog, with the SDK's generated client: its parse is E2B's shape.
    listed = get_templates.sync(client=client)
    assert isinstance(listed, list) and all(isinstance(t, TemplateView) for t in listed)
    (mine,) = [t for t in listed if t.template_id == name]
    assert (mine.build_id, mine.build_status.value, mine.build_count) == (third.build_id, "ready", 3)
    assert mine.names == [name]
    described = get_templates_template_id.sync(template_id=name, client=client)
    assert isinstance(described, TemplateWithBuilds)
    assert [str(b.build_id) for b in described.builds] == [third.build_id, second.build_id, first.build_id]
    assert {b.status.value for b in described.builds} == {"ready"}
    other = get_api_client(ConnectionConfig(api_key=up.other_key, api_url=up.url))
    assert name not in [t.template_id for t in get_templates.sync(client=other) or []]


def test_templates_are_listed_oldest_first(up: Up) -> None:
    names = [f"tpl-order-{i}-{uuid.uuid4().hex[:6]}" for i in range(2)]
    for name in names:
        Template.build(_writes(name), name, **up.opts())
    client = get_api_client(ConnectionConfig(api_key=up.key, api_url=up.url))
    listed = [t.template_id for t in get_templates.sync(client=client) or [] if t.template_id in names]
    assert listed == names


def test_tags_async(up: Up) -> None:
    async def go() -> None:
        name = f"tpl-atags-{uuid.uuid4().hex[:8]}"
        template = AsyncTemplate().from_base_image().run_cmd("echo async > /home/user/v.txt")
        built = await AsyncTemplate.build(template, f"{name}:v2", tags=["edge"], **up.opts())
        assert sorted(built.tags) == ["edge", "v2"]
        assert {t.tag for t in await AsyncTemplate.get_tags(name, **up.opts())} == {"v2", "edge"}
        sandbox = await AsyncSandbox.create(f"{name}:edge", **up.opts())
        try:
            assert (await sandbox.files.read("/home/user/v.txt")).strip() == "async"
        finally:
            await sandbox.kill()
        await AsyncTemplate.assign_tags(f"{name}:v2", "default", **up.opts())
        await AsyncTemplate.remove_tags(name, "edge", **up.opts())
        assert {t.tag for t in await AsyncTemplate.get_tags(name, **up.opts())} == {"v2", "default"}
        plain = await AsyncSandbox.create(name, **up.opts())
        await plain.kill()

    asyncio.run(go())
