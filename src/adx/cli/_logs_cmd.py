"""``adx env logs ID [--follow] [--tail N] [--since WHEN]``: an Environment's workload output.

stdout lines go to stdout and stderr lines to stderr (so a pipe sees the workload's own split); ``--timestamps``
prefixes each line with the time the node read it; ``--json`` prints one JSON object per line instead."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from adx.cli._api_client import ApiKey, ApiUrl, api_client
from adx.cli._env_cmd import EnvId, env_app
from adx.cli._human import parse_duration
from adx.cli._output import Json, failing, print_json_line
from adx.errors import InvalidInputError

if TYPE_CHECKING:
    from adx.model import LogEntry


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``10m``, ``1h30m``, ``45s``, ``2d`` (that long ago) or an RFC 3339 time (no zone: UTC)."""
    ago = parse_duration(text)
    if ago is not None:
        return (now or datetime.now(UTC)) - timedelta(seconds=ago)
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInputError(
            "--since", f"must be a duration (10m, 1h30m, 45s) or an RFC 3339 time, got {text!r}"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _print(line: LogEntry, timestamps: bool, as_json: bool) -> None:
    if as_json:
        print_json_line(line.to_wire())
        return
    out = sys.stdout if line.stream == "stdout" else sys.stderr
    prefix = (
        line.time.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z") + " " if timestamps else ""
    )
    out.write(f"{prefix}{line.text}" + ("" if line.partial else "\n"))
    out.flush()


@env_app.command("logs")
def logs(
    environment_id: EnvId,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new lines until Ctrl-C")] = False,
    tail: Annotated[int | None, typer.Option("--tail", "-n", help="start with the last N lines")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="only lines since: a duration (10m, 1h30m) or an RFC 3339 time")
    ] = None,
    timestamps: Annotated[bool, typer.Option("--timestamps", "-t", help="prefix each line with its time")] = False,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """The workload's stdout and stderr, kept by its node across restarts (a paused Environment is not woken)."""
    try:
        with failing():
            start = parse_since(since) if since is not None else None
            with api_client(api_url, api_key) as client:
                env = client.environments.get(environment_id)
                lines = (
                    env.follow_logs(tail=tail, since=start)
                    if follow
                    else env.logs(tail=tail, since=start, limit=10_000).lines
                )
                for line in lines:
                    _print(line, timestamps, as_json)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
