"""``adx env create|list|get|exec|pause|resume|lifetime|delete``: Environments through the Python SDK."""

from __future__ import annotations

import shlex
import signal
import sys
import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from adx.cli._api_client import ApiKey, ApiUrl, api_client, with_api
from adx.cli._app import app, console, err_console
from adx.cli._human import format_deadline, format_duration, format_time, format_timer
from adx.cli._output import Json, failing, print_json, print_listing
from adx.errors import AdxError, InvalidInputError, UnavailableError

env_app = typer.Typer(
    help="Environments: create, list, get, exec, pause, resume, lifetime, delete.", no_args_is_help=True
)
app.add_typer(env_app, name="env")

EnvId = Annotated[str, typer.Argument(help="the Environment's ID")]
P = TypeVar("P")


def _wire(env: Any) -> dict[str, object]:
    """The Environment as the HTTP API shows it (camelCase): the SDK's fields through the API's own model."""
    from adx.model import EnvironmentView

    return EnvironmentView.model_validate({name: getattr(env, name) for name in EnvironmentView.model_fields}).wire()


# An SDK argument (or spec path under it) -> the `adx env create` flag that sets it (longest first), so an
# input error names what the user typed.
_FLAGS = [
    ("pause.retention", "--retention"),
    ("pause.timeoutSeconds", "--pause-timeout"),
    ("pause.storage", "--storage"),
    ("retention", "--retention"),
    ("restart.maxRetries", "--max-retries"),
    ("restart.initialBackoffSeconds", "--backoff"),
    ("restart.maxBackoffSeconds", "--max-backoff"),
    ("restart", "--max-backoff"),  # the model-level check: maxBackoffSeconds must be at least the initial
    ("idle_timeout", "--idle-timeout"),
    ("idle_action", "--idle-action"),
    ("lifetime_action", "--lifetime-action"),
    ("lifetime", "--lifetime"),
    ("cpu", "--cpu"),
    ("memory", "--memory"),
    ("disk", "--disk"),
    ("image", "--image"),
    ("entrypoint", "--entrypoint"),
    ("env", "--env"),
    ("metadata", "--metadata"),
    ("volumes", "--volume"),
    # set_lifetime's arguments (`adx env lifetime ID SECONDS --action`)
    ("seconds", "SECONDS"),
    ("action", "--action"),
]


def _flag_error(exc: AdxError) -> AdxError:
    """The same error, naming the command-line flag instead of the SDK argument (an input error)."""
    if not isinstance(exc, InvalidInputError):
        return exc
    for prefix, flag in _FLAGS:
        if exc.field == prefix or exc.field.startswith((prefix + ".", prefix + "[")):
            return InvalidInputError(flag, exc.reason)
    return exc


def _retention(text: str) -> Any:
    """``--retention``: ``ttl:SECONDS``, ``ttl`` (the default TTL) or ``forever``."""
    import adx

    kind, _, seconds = text.partition(":")
    if kind == "forever" and not seconds:
        return adx.Retention.forever()
    if kind == "ttl" and not seconds:
        return adx.Retention.ttl()
    if kind == "ttl" and seconds.isdigit():
        return adx.Retention.ttl(int(seconds))
    raise InvalidInputError("--retention", f"expected ttl:SECONDS, ttl or forever, got {text!r}")


def _policy(policy: Callable[..., P], **flags: object) -> P | None:
    """``policy`` built from the flags given (None: not given, so the SDK's default); None when none was given."""
    given = {name: value for name, value in flags.items() if value is not None}
    return policy(**given) if given else None


def _expiry(env: Any) -> str:
    if env.expires_at is None:
        return "never"
    return f"{format_deadline(env.expires_at)} -> {env.lifecycle.lifetime_action.value}"


def _pairs(option: str, values: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInputError(option, f"expected KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _volume_mounts(values: list[str]) -> dict[str, str]:
    """``--volume NAME=/PATH`` (repeatable) as the SDK's ``{path: name}``; a path given twice is an error."""
    mounts: dict[str, str] = {}
    for item in values:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InvalidInputError("--volume", f"expected NAME=/PATH, got {item!r}")
        if path in mounts:
            raise InvalidInputError("--volume", f"{path} is mounted twice")
        mounts[path] = name
    return mounts


def _show(env: Any, as_json: bool) -> None:
    from adx.model import format_bytes, format_cpu  # here: pydantic is not loaded for `adx env --help`

    if as_json:
        print_json(_wire(env))
        return
    data = _wire(env)
    for key in ("id", "state", "node", "executionId", "image", "entrypoint", "restartAttempts", "lastError"):
        if data[key] not in (None, [], {}):
            console.print(f"{key:<16} {data[key]}", highlight=False, soft_wrap=True, markup=False)
    console.print(f"{'created':<16} {format_time(env.created_at)}", highlight=False)
    resources = env.resources
    console.print(
        f"{'resources':<16} cpu {format_cpu(resources.cpu_millis)}, memory {format_bytes(resources.memory_bytes)}, "
        f"disk {format_bytes(resources.disk_bytes) if resources.disk_bytes else 'not reserved'}",
        highlight=False,
    )
    lifecycle = env.lifecycle
    console.print(
        f"{'lifecycle':<16} idle timeout {format_timer(lifecycle.idle_timeout_seconds)}"
        + (f" -> {lifecycle.idle_action.value}" if lifecycle.idle_timeout_seconds > 0 else ""),
        highlight=False,
    )
    if env.expires_at is not None:
        console.print(f"{'expires':<16} {_expiry(env)}", highlight=False)
    if env.volumes:
        mounts = ", ".join(f"{m.name} at {m.path}" for m in env.volumes)
        console.print(f"{'volumes':<16} {mounts}", highlight=False, markup=False)
    if env.publication_pending:
        console.print(
            f"{'publication':<16} pending: the node did this; the cluster shows it once the Coordinator is back",
            highlight=False,
        )
    if env.checkpoint is not None:
        ckpt = env.checkpoint
        kept = "forever" if ckpt.expires_at is None else f"until {format_deadline(ckpt.expires_at)}"
        lost = ", its node is gone" if env.ownership_lost else ""
        console.print(
            f"{'checkpoint':<16} {ckpt.id} ({ckpt.storage} on {ckpt.node}, {format_bytes(ckpt.size_bytes)}, "
            f"kept {kept}{lost})",
            highlight=False,
            markup=False,
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
    retention: Annotated[
        str | None, typer.Option("--retention", help="how long a pause checkpoint is kept: ttl:SECONDS or forever")
    ] = None,
    storage: Annotated[
        str | None, typer.Option("--storage", help="pause checkpoints on: configured (default), local or shared")
    ] = None,
    pause_timeout: Annotated[
        int | None, typer.Option("--pause-timeout", help="seconds a pause's capture may take (default 300)")
    ] = None,
    max_retries: Annotated[
        int | None, typer.Option("--max-retries", help="restart the workload on exit up to N times")
    ] = None,
    backoff: Annotated[
        float | None, typer.Option("--backoff", help="seconds before the first restart (doubles each time)")
    ] = None,
    max_backoff: Annotated[float | None, typer.Option("--max-backoff", help="longest wait between restarts")] = None,
    lifetime: Annotated[
        int | None, typer.Option("--lifetime", help="seconds from creation until --lifetime-action")
    ] = None,
    lifetime_action: Annotated[
        str | None, typer.Option("--lifetime-action", help="at the end of --lifetime: delete (default) or pause")
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="KEY=VALUE, repeatable")] = None,
    metadata: Annotated[list[str] | None, typer.Option("--metadata", help="KEY=VALUE, repeatable")] = None,
    volume: Annotated[
        list[str] | None, typer.Option("--volume", help="NAME=/PATH: mount the volume NAME at PATH, repeatable")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="wait until it is running")] = True,
    wait_timeout: Annotated[float, typer.Option("--wait-timeout", help="seconds")] = 120.0,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Create an Environment and print it (its ID first)."""
    import adx

    with failing(_flag_error):
        pause = _policy(
            adx.PausePolicy,
            retention=_retention(retention) if retention is not None else None,
            timeout_seconds=pause_timeout,
            storage=storage,
        )
        restart = _policy(
            adx.RestartPolicy, max_retries=max_retries, initial_backoff_seconds=backoff, max_backoff_seconds=max_backoff
        )
        with api_client(api_url, api_key) as client:
            with err_console.status("creating the Environment..."):
                created = client.environments.create(
                    cpu=cpu,
                    memory=memory,
                    disk=disk,
                    image=image,
                    entrypoint=shlex.split(entrypoint) if entrypoint is not None else None,
                    idle_timeout=idle_timeout,
                    idle_action=idle_action,
                    pause=pause,
                    restart=restart,
                    lifetime=lifetime,
                    lifetime_action=lifetime_action,
                    env=_pairs("--env", env),
                    metadata=_pairs("--metadata", metadata),
                    volumes=_volume_mounts(volume) if volume else None,
                    wait=False,
                )
            if wait:
                with err_console.status(f"waiting for {created.id} to run (node {created.node})..."):
                    created.wait_until_running(wait_timeout)
            _show(created, as_json)


@env_app.command("list")
def list_(as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """List your Environments."""
    from adx.model import format_bytes, format_cpu  # here: pydantic is not loaded for `adx env --help`

    print_listing(
        with_api(api_url, api_key, lambda client: client.environments.list()),
        as_json,
        key="environments",
        wire=_wire,
        header=("ID", "STATE", "NODE", "CPU", "MEMORY", "CREATED"),
        row=lambda e: (
            e.id,
            e.state.value,
            e.node or "-",
            format_cpu(e.resources.cpu_millis),
            format_bytes(e.resources.memory_bytes),
            format_time(e.created_at),
        ),
    )


@env_app.command("get")
def get(environment_id: EnvId, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Show one Environment."""
    _show(with_api(api_url, api_key, lambda client: client.environments.get(environment_id)), as_json)


@env_app.command("stats")
def stats(environment_id: EnvId, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """CPU, memory and disk usage of a running Environment (its node's last sample; a paused one is not woken)."""
    from adx.model import format_bytes  # here: pydantic is not loaded for `adx env --help`

    usage = with_api(api_url, api_key, lambda client: client.environments.get(environment_id).stats())
    if as_json:
        print_json(usage.to_wire())
        return
    cpu = "n/a (one sample so far)" if usage.cpu_percent is None else f"{usage.cpu_percent:.1f}%"
    limit = f" of {usage.cpu_limit_cores:g} cores" if usage.cpu_limit_cores else ""
    memory_limit = f" of {format_bytes(usage.memory_limit_bytes)}" if usage.memory_limit_bytes else ""
    disk_limit = f" of {format_bytes(usage.disk_limit_bytes)}" if usage.disk_limit_bytes else ""
    for key, value in (
        ("id", usage.environment_id),
        ("execution", f"{usage.execution_id} (generation {usage.generation}) on {usage.node}"),
        ("cpu", f"{cpu}{limit}, {usage.cpu_usage_seconds:.2f}s used"),
        ("memory", f"{format_bytes(usage.memory_bytes)}{memory_limit} (peak {format_bytes(usage.memory_peak_bytes)})"),
        ("disk", f"{format_bytes(usage.disk_bytes)}{disk_limit}"),
        ("processes", f"{usage.pids}" + (f", {usage.oom_kills} OOM kills" if usage.oom_kills else "")),
        ("sampled", f"{format_duration(usage.sample_age_seconds)} ago"),
    ):
        console.print(f"{key:<16} {value}", highlight=False, markup=False)


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
    with failing(), api_client(api_url, api_key) as client:
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
    _show_state(env, as_json)


def _show_state(env: Any, as_json: bool, more: str = "") -> None:
    """What a state change prints: the Environment's JSON, or ``ID STATE`` (and ``more``)."""
    if as_json:
        print_json(_wire(env))
    else:
        console.print(f"{env.id} {env.state.value}{more}", highlight=False)


def _transition(
    environment_id: str, doing: str, call: str, as_json: bool, api_url: str | None, api_key: str | None
) -> None:
    """Pause or resume (``call``), showing ``doing`` while it runs, then print ``ID STATE`` (or the JSON)."""
    with failing(), api_client(api_url, api_key) as client:
        env = client.environments.get(environment_id)
        with err_console.status(f"{doing} {environment_id}..."):
            getattr(env, call)()
    _show_state(env, as_json)


@env_app.command("pause")
def pause(environment_id: EnvId, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Pause an Environment: checkpoint its files, then free its node resources. Prints `ID paused`."""
    _transition(environment_id, "pausing", "pause", as_json, api_url, api_key)


@env_app.command("resume")
def resume(environment_id: EnvId, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Resume a paused Environment (a running one stays as it is). Prints `ID running`."""
    _transition(environment_id, "resuming", "resume", as_json, api_url, api_key)


@env_app.command("lifetime")
def lifetime_(
    environment_id: EnvId,
    seconds: Annotated[int, typer.Argument(help="the new deadline is now + SECONDS")],
    action: Annotated[
        str | None, typer.Option("--action", help="at the deadline: delete or pause (default: unchanged)")
    ] = None,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Move an Environment's lifetime deadline. Prints `ID STATE expires TIME (Ns) -> ACTION`."""
    with failing(_flag_error), api_client(api_url, api_key) as client:
        env = client.environments.get(environment_id).set_lifetime(seconds, action)
    _show_state(env, as_json, f" expires {_expiry(env)}")


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

    with failing(), api_client(api_url, api_key) as client:
        result = client.environments.get(environment_id).commands.run(
            " ".join(command) if shell else command,
            cwd=cwd,
            env=_pairs("--env", env),
            timeout=timeout,
            on_stdout=out,
            on_stderr=err,
        )
    if result.timed_out:
        err_console.print(f"adx: the command timed out after {timeout:g}s", highlight=False)
    if result.exit_code is not None:
        raise typer.Exit(result.exit_code)
    # Killed by a signal: the shell convention 128 + signal number.
    number = result.signal if isinstance(result.signal, int) else getattr(signal, str(result.signal), 9)
    raise typer.Exit(128 + int(number))


# Each registers its commands on env_app (and imports this module).
from adx.cli import _logs_cmd, _token_cmd  # noqa: E402,F401
