"""``adx env create|list|get|exec|pause|resume|delete``: Environments through the Python SDK."""

from __future__ import annotations

import json
import shlex
import signal
import sys
import time
from typing import Annotated, Any

import typer
from rich.table import Table

from adx.cli._app import app, console, err_console, fail
from adx.errors import AdxError, InvalidInputError, UnavailableError

env_app = typer.Typer(help="Environments: create, list, get, exec, delete.", no_args_is_help=True)
app.add_typer(env_app, name="env")

ApiUrl = Annotated[str | None, typer.Option("--api-url", help="default: ADX_API_URL or the `adx up` credentials")]
ApiKey = Annotated[str | None, typer.Option("--api-key", help="default: ADX_API_KEY or the `adx up` credentials")]
Json = Annotated[bool, typer.Option("--json", help="print JSON (the HTTP object) instead of text")]
EnvId = Annotated[str, typer.Argument(help="the Environment's ID")]


def _client(api_url: str | None, api_key: str | None) -> Any:
    import adx

    return adx.Client(api_url=api_url, api_key=api_key)


def _wire(env: Any) -> dict[str, Any]:
    """The Environment as the HTTP API shows it (camelCase)."""
    return {
        "id": env.id,
        "state": env.state.value,
        "node": env.node,
        "executionId": env.execution_id,
        "createdAt": env.created_at,
        "updatedAt": env.updated_at,
        "image": env.image,
        "resources": env.resources.to_wire(),
        "entrypoint": env.entrypoint,
        "metadata": env.metadata,
        "lifecycle": env.lifecycle.to_wire(),
        "restartAttempts": env.restart_attempts,
        "restartPending": env.restart_pending,
        "checkpoint": env.checkpoint.to_wire() if env.checkpoint else None,
        "lastError": env.last_error,
    }


def _print_json(value: object) -> None:
    # Plain print: rich would wrap or colour it, and this output is for programs.
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def _pairs(option: str, values: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInputError(option, f"expected KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _show(env: Any, as_json: bool) -> None:
    if as_json:
        _print_json(_wire(env))
        return
    data = _wire(env)
    for key in ("id", "state", "node", "executionId", "image", "entrypoint", "restartAttempts", "lastError"):
        if data[key] not in (None, [], {}):
            console.print(f"{key:<16} {data[key]}", highlight=False, soft_wrap=True, markup=False)
    resources = env.resources
    console.print(
        f"{'resources':<16} cpu {resources.cpu_millis}m, memory {resources.memory_bytes} B, "
        f"disk {resources.disk_bytes} B",
        highlight=False,
    )
    lifecycle = env.lifecycle
    console.print(
        f"{'lifecycle':<16} idle {lifecycle.idle_timeout_seconds}s -> {lifecycle.idle_action.value}", highlight=False
    )


@env_app.command("create")
def create(
    cpu: Annotated[str, typer.Option("--cpu", help="cores (1, 0.5) or millicores (500m)")] = "1",
    memory: Annotated[str, typer.Option("--memory", help="bytes, or with a unit: 512Mi, 2G")] = "512Mi",
    disk: Annotated[str | None, typer.Option("--disk", help="disk reservation, e.g. 1Gi")] = None,
    image: Annotated[str | None, typer.Option("--image", help="root image (default: the node's 'base')")] = None,
    entrypoint: Annotated[
        str | None, typer.Option("--entrypoint", help="workload command line, e.g. 'python3 -m http.server 8000'")
    ] = None,
    idle_timeout: Annotated[int | None, typer.Option("--idle-timeout", help="seconds; 0 never reclaims")] = None,
    idle_action: Annotated[str | None, typer.Option("--idle-action", help="delete (default) or pause")] = None,
    max_retries: Annotated[
        int | None, typer.Option("--max-retries", help="restart the workload on exit up to N times")
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="KEY=VALUE, repeatable")] = None,
    metadata: Annotated[list[str] | None, typer.Option("--metadata", help="KEY=VALUE, repeatable")] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="wait until it is running")] = True,
    wait_timeout: Annotated[float, typer.Option("--wait-timeout", help="seconds")] = 120.0,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Create an Environment and print it (its ID first)."""
    import adx

    try:
        restart = adx.RestartPolicy(max_retries=max_retries) if max_retries is not None else None
        with _client(api_url, api_key) as client:
            with err_console.status("creating the Environment..."):
                created = client.environments.create(
                    cpu=cpu,
                    memory=memory,
                    disk=disk,
                    image=image,
                    entrypoint=shlex.split(entrypoint) if entrypoint is not None else None,
                    idle_timeout=idle_timeout,
                    idle_action=idle_action,
                    restart=restart,
                    env=_pairs("--env", env),
                    metadata=_pairs("--metadata", metadata),
                    wait=False,
                )
            if wait:
                with err_console.status(f"waiting for {created.id} to run (node {created.node})..."):
                    created.wait_until_running(wait_timeout)
            _show(created, as_json)
    except AdxError as exc:
        fail(exc)


@env_app.command("list")
def list_(as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """List your Environments."""
    try:
        with _client(api_url, api_key) as client:
            environments = client.environments.list()
    except AdxError as exc:
        fail(exc)
    if as_json:
        _print_json({"environments": [_wire(e) for e in environments]})
        return
    table = Table("ID", "STATE", "NODE", "CPU", "MEMORY", box=None, pad_edge=False)
    for e in environments:
        table.add_row(e.id, e.state.value, e.node or "-", f"{e.resources.cpu_millis}m", str(e.resources.memory_bytes))
    console.print(table, soft_wrap=True)


@env_app.command("get")
def get(environment_id: EnvId, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Show one Environment."""
    try:
        with _client(api_url, api_key) as client:
            _show(client.environments.get(environment_id), as_json)
    except AdxError as exc:
        fail(exc)


@env_app.command("delete")
def delete(
    environment_id: EnvId,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="wait until it is deleted")] = False,
    wait_timeout: Annotated[float, typer.Option("--wait-timeout", help="seconds")] = 60.0,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Delete an Environment (repeating it is harmless)."""
    try:
        with _client(api_url, api_key) as client:
            env = client.environments.delete(environment_id)
            if wait:
                deadline = time.monotonic() + wait_timeout
                with err_console.status(f"deleting {environment_id}..."):
                    while env.state != "deleted":
                        if time.monotonic() > deadline:
                            raise UnavailableError(
                                f"environment {environment_id} is still {env.state.value} after {wait_timeout:g}s"
                            )
                        time.sleep(0.1)
                        env.refresh()
            if as_json:
                _print_json(_wire(env))
            else:
                console.print(f"{env.id} {env.state.value}", highlight=False)
    except AdxError as exc:
        fail(exc)


@env_app.command("pause")
def pause(environment_id: EnvId, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Pause an Environment (checkpoint, then free its node resources)."""
    try:
        with _client(api_url, api_key) as client:
            env = client.environments.get(environment_id).pause()
            console.print(f"{env.id} {env.state.value}", highlight=False)
    except AdxError as exc:
        fail(exc)


@env_app.command("resume")
def resume(environment_id: EnvId, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Resume a paused Environment."""
    try:
        with _client(api_url, api_key) as client:
            env = client.environments.get(environment_id).resume()
            console.print(f"{env.id} {env.state.value}", highlight=False)
    except AdxError as exc:
        fail(exc)


@env_app.command("exec")
def exec_(
    environment_id: EnvId,
    command: Annotated[list[str], typer.Argument(help="the command and its arguments (after --)")],
    shell: Annotated[bool, typer.Option("--shell", "-s", help="run the words as one /bin/sh -c command line")] = False,
    cwd: Annotated[str | None, typer.Option("--cwd", help="working directory inside the Environment")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="KEY=VALUE, repeatable")] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", help="kill the command after N seconds")] = None,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Run a command in an Environment: output streams as it is produced; exits with the command's code."""

    def out(data: str) -> None:
        sys.stdout.write(data)
        sys.stdout.flush()

    def err(data: str) -> None:
        sys.stderr.write(data)
        sys.stderr.flush()

    try:
        with _client(api_url, api_key) as client:
            target = client.environments.get(environment_id)
            result = target.commands.run(
                " ".join(command) if shell else command,
                cwd=cwd,
                env=_pairs("--env", env),
                timeout=timeout,
                on_stdout=out,
                on_stderr=err,
            )
    except AdxError as exc:
        fail(exc)
    if result.timed_out:
        err_console.print(f"adx: the command timed out after {timeout:g}s", highlight=False)
    if result.exit_code is not None:
        raise typer.Exit(result.exit_code)
    # Killed by a signal: the shell convention 128 + signal number.
    number = result.signal if isinstance(result.signal, int) else getattr(signal, str(result.signal), 9)
    raise typer.Exit(128 + int(number))
