"""E2B template builds (issue 14) through the real ``e2b`` SDK, sync and async, against ``adx up``: a template
built with ``Template.build`` becomes an ADX image that ``Sandbox.create(template=name)`` runs; a rebuild reuses the
layers of its unchanged steps; a failing RUN and a FROM this server cannot have raise the SDK's ``BuildException``
with the reason. The store's ``base`` is the Debian image (from the test image cache), as E2B's base image is."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest
from e2b import (
    AsyncSandbox,
    AsyncTemplate,
    BuildException,
    LogEntry,
    Sandbox,
    SandboxException,
    Template,
    wait_for_file,
)
from e2b_up import Up, running_debian_up
from test_e2b_template_steps import _schema

from adx.images import ImageStore

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with running_debian_up(tmp_path_factory.mktemp("e2b-templates")) as running:
        yield running


def _store(up: Up) -> ImageStore:
    return ImageStore(up.state / "sandboxd" / "data" / "images" / "store")


def _messages(logs: list[LogEntry]) -> str:
    return "\n".join(entry.message for entry in logs)


def _template(context: Path, greeting: str) -> Template:
    return (
        Template(file_context_path=context)
        .from_base_image()
        .run_cmd("echo built-by-run > /home/user/built.txt")
        .copy("hello.txt", "/home/user/hello.txt")
        .set_envs({"GREETING": greeting})
    )


def test_a_template_builds_runs_and_rebuilds_from_its_cache(up: Up, tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("copied from the client\n")
    name = f"tpl-{uuid.uuid4().hex[:8]}"
    logs: list[LogEntry] = []
    info = Template.build(_template(tmp_path, "hi"), alias=name, on_build_logs=logs.append, **up.opts())
    assert info.template_id == name and info.build_id
    text = _messages(logs)
    assert "Uploaded 'hello.txt'" in text and f"Template {name} is ready" in text, text
    assert "RUN" in text and "built in" in text and 'COPY ["hello.txt"' in text, text
    first = _store(up).get(name)

    sandbox = Sandbox.create(template=name, **up.opts())
    try:
        run = sandbox.commands.run("cat /home/user/built.txt /home/user/hello.txt; echo $GREETING; whoami")
        assert run.stdout == "built-by-run\ncopied from the client\nhi\nuser\n"
        assert sandbox.get_info().template_id == name
    finally:
        sandbox.kill()

    # Only the last step changes: the RUN and COPY layers come from the cache, the file is not uploaded again.
    logs.clear()
    Template.build(_template(tmp_path, "hello again"), alias=name, on_build_logs=logs.append, **up.opts())
    text = _messages(logs)
    assert "Skipping upload of 'hello.txt', already cached" in text, text
    cached = [line for line in text.splitlines() if line.startswith("CACHED")]
    assert any("RUN" in line for line in cached) and any("COPY" in line for line in cached), text
    assert "built in" not in text, text  # nothing ran again
    second = _store(up).get(name)
    assert second.layers == first.layers and second.env["GREETING"] == "hello again"
    assert Template.exists(name, **up.opts()) is True
    assert Template.exists(name, **up.opts(up.other_key)) is True  # E2B: taken by another team (403)
    assert Template.exists(f"no-such-{name}", **up.opts()) is False

    # Deleting the template (E2B's DELETE /templates/{id}) removes its image; another tenant gets a 404.
    other = httpx.delete(f"{up.url}/templates/{name}", headers={"X-API-KEY": up.other_key})
    assert other.status_code == 404, other.text
    deadline = time.monotonic() + 30
    while (deleted := httpx.delete(f"{up.url}/templates/{name}", headers={"X-API-KEY": up.key})).status_code == 409:
        assert time.monotonic() < deadline, deleted.text  # the killed sandbox still mounts its layers
        time.sleep(0.5)
    assert deleted.status_code == 204, deleted.text
    assert _store(up).find(name) is None and Template.exists(name, **up.opts()) is False


def test_a_failing_run_raises_the_build_error_with_its_output(up: Up) -> None:
    name = f"tpl-fail-{uuid.uuid4().hex[:8]}"
    logs: list[LogEntry] = []
    template = Template().from_base_image().run_cmd("echo doomed-output; exit 3")
    with pytest.raises(BuildException) as raised:
        Template.build(template, alias=name, on_build_logs=logs.append, **up.opts())
    message = str(raised.value)
    assert "step 1" in message and "exit code 3" in message and "doomed-output" in message, message
    assert any(entry.level == "error" for entry in logs), _messages(logs)
    assert _store(up).find(name) is None  # no image from a failed build
    assert Template.exists(name, **up.opts()) is False


def test_an_image_this_server_cannot_pull_is_a_clear_build_error(up: Up) -> None:
    template = Template().from_image("python:3.12").run_cmd("true")
    with pytest.raises(BuildException) as raised:
        Template.build(template, alias=f"tpl-py-{uuid.uuid4().hex[:8]}", **up.opts())
    message = str(raised.value)
    assert "'python:3.12'" in message and "registry" in message, message


def test_another_tenant_cannot_use_a_template_upload_url(up: Up, tmp_path: Path) -> None:
    """The upload URL is signed for the tenant, template and files hash: changed, it writes nothing (403)."""
    name = f"tpl-up-{uuid.uuid4().hex[:8]}"
    headers = {"X-API-KEY": up.key}
    made = httpx.post(f"{up.url}/v3/templates", json={"name": name}, headers=headers)
    assert made.status_code == 202, made.text
    jsonschema.validate(made.json(), _schema("TemplateRequested"))
    files_hash = "a" * 64
    link = httpx.get(f"{up.url}/templates/{name}/files/{files_hash}", headers=headers)
    assert link.status_code == 201 and link.json()["present"] is False, link.text
    jsonschema.validate(link.json(), _schema("TemplateFileUpload"))
    status = httpx.get(f"{up.url}/templates/{name}/builds/{made.json()['buildID']}/status", headers=headers)
    assert status.status_code == 200 and status.json()["status"] == "waiting", status.text
    jsonschema.validate(status.json(), _schema("TemplateBuildInfo"))
    url = link.json()["url"]
    assert httpx.put(url.replace(files_hash, "b" * 64), content=b"x").status_code == 403
    other = httpx.get(f"{up.url}/templates/{name}/files/{files_hash}", headers={"X-API-KEY": up.other_key})
    assert other.status_code == 404, other.text
    assert (
        httpx.post(f"{up.url}/v3/templates", json={"name": name}, headers={"X-API-KEY": up.other_key}).status_code
        == 409
    )


def test_async_template_build_and_sandbox(up: Up, tmp_path: Path) -> None:
    """AsyncTemplate: WORKDIR, a RUN as root, a COPY owned by ``user`` with a mode, ENV, the start command kept on
    the image; a template built FROM it; ``skip_cache`` builds every step again."""
    (tmp_path / "tool.sh").write_text("#!/bin/sh\necho tool\n")

    def template(marker: str) -> AsyncTemplate:
        return (
            AsyncTemplate(file_context_path=tmp_path)
            .from_base_image()
            .set_workdir("/opt/app")
            .run_cmd(f"echo {marker} > marker && chown user marker", user="root")
            .copy("tool.sh", "bin/", user="user", mode=0o750)
            .copy("tool.sh", "/home/user/tool.sh")  # root's file; /home/user stays user's (written below)
            .run_cmd("echo written-after-copy > /home/user/after")
            .set_envs({"MODE": "async"})
        )

    async def go() -> None:
        name = f"tpl-async-{uuid.uuid4().hex[:8]}"
        logs: list[LogEntry] = []
        final = template("from-async").set_start_cmd("sleep 600", "true")
        await AsyncTemplate.build(final, alias=name, on_build_logs=logs.append, **up.opts())
        assert f"Template {name} is ready" in _messages(logs)
        assert _store(up).get(name).start_cmd == "sleep 600"
        child = f"{name}-child"
        await AsyncTemplate.build(
            AsyncTemplate().from_template(name).set_envs({"CHILD": "yes"}), alias=child, **up.opts()
        )
        sandbox = await AsyncSandbox.create(template=child, **up.opts())
        try:
            run = await sandbox.commands.run(
                "cat /opt/app/marker /home/user/after; echo $MODE $CHILD; stat -c '%U %a' /opt/app/bin/tool.sh "
                "/home/user/tool.sh /home/user /opt/app/marker /home/user/after /opt/app"
            )
            # Files RUN steps made keep the owners they had inside the build sandbox (not its host ID slice).
            owners = "user 750\nroot 644\nuser 755\nuser 644\nuser 644\nroot 755\n"
            assert run.stdout == "from-async\nwritten-after-copy\nasync yes\n" + owners
        finally:
            await sandbox.kill()

        logs.clear()
        await AsyncTemplate.build(
            template("from-async"), alias=name, skip_cache=True, on_build_logs=logs.append, **up.opts()
        )
        text = _messages(logs)
        assert "CACHED" not in text and "RUN" in text and "built in" in text, text

    asyncio.run(go())


def test_a_templates_start_command_runs_at_create_and_the_create_waits_until_ready(up: Up) -> None:
    """``set_start_cmd(start, ready)``: a sandbox created from the template has its start command running, started
    as the template's user in its workdir, and the create answers only once the ready command succeeded (the start
    command writes its file a second late: the first command sees it)."""
    name = f"tpl-start-{uuid.uuid4().hex[:8]}"
    template = (
        Template()
        .from_base_image()
        .set_workdir("/opt/app")
        .set_start_cmd(
            "sleep 1; echo started-$(whoami)-$(pwd) > /tmp/started; exec sleep 600", wait_for_file("/tmp/started")
        )
    )
    Template.build(template, alias=name, **up.opts())
    sandbox = Sandbox.create(template=name, **up.opts())
    try:
        assert sandbox.commands.run("cat /tmp/started").stdout == "started-user-/opt/app\n"
        running = [" ".join([p.cmd, *p.args]) for p in sandbox.commands.list()]
        assert any("exec sleep 600" in line for line in running), running
    finally:
        sandbox.kill()


def test_a_start_command_that_fails_fails_the_create_naming_it(up: Up) -> None:
    """A start command that exits non-zero before the ready command succeeds: the async create raises the SDK's
    error with the command, its exit code and its output, and leaves no sandbox behind."""
    name = f"tpl-badstart-{uuid.uuid4().hex[:8]}"
    template = Template().from_base_image().set_start_cmd("echo boom-output; exit 7", "test -e /tmp/never")

    async def go() -> None:
        await AsyncTemplate.build(template, alias=name, **up.opts())
        with pytest.raises(SandboxException) as raised:
            await AsyncSandbox.create(template=name, **up.opts())
        message = str(raised.value)
        assert "start command" in message and "exited with code 7" in message and "boom-output" in message, message
        assert [s for s in (await AsyncSandbox.list(**up.opts()).next_items()) if s.name == name] == []

    asyncio.run(go())


def test_a_ready_command_that_timed_out_is_not_ready_and_reports_envds_exit_code() -> None:
    """A timed-out end frame without a signal (the command exited 0 as execd's deadline passed): the ready loop
    reads it by the same rule as the process service's EndEvent, so it reports exit code 0 with envd's
    ``context deadline exceeded``, and a run out of time is not a ready sandbox (it used to say exit code -1)."""
    from adx.e2b._ends import end_of
    from adx.e2b._start_cmd import frames_result
    from adx.model import ExitFrame

    body = (
        b'{"id":"0123456789ab","pid":42}\n{"stream":"stdout","data":"checking\\n"}\n'
        b'{"exitCode":0,"signal":null,"timedOut":true}\n'
    )
    run = frames_result(body)
    assert run.end == end_of(ExitFrame(exit_code=0, signal=None, timed_out=True))
    assert run.end is not None and run.end.wire() == {
        "exitCode": 0,
        "exited": True,
        "status": "exit status 0",
        "error": "context deadline exceeded",
    }
    assert not run.succeeded
    assert run.describe() == "exit code 0 (context deadline exceeded), output 'checking\\n'"
    # Killed by execd at its deadline (the usual case): exit code -1 by signal, as envd's os/exec says it.
    killed = frames_result(b'{"exitCode":null,"signal":9,"timedOut":true}\n')
    assert killed.end is not None and (killed.end.exit_code, killed.end.exited) == (-1, False)
    assert not killed.succeeded
    assert frames_result(b'{"exitCode":0,"signal":null,"timedOut":false}\n').succeeded
