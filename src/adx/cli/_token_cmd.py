"""``adx env token create|list|revoke``: endpoint tokens (SEC-4), credentials that reach one Environment's data
plane (or one port of it) and nothing else, for handing a sandbox URL to someone without the tenant's API key."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from adx.cli._api_client import ApiKey, ApiUrl, api_client, with_api
from adx.cli._app import console
from adx.cli._env_cmd import EnvId, env_app
from adx.cli._human import format_time, parse_duration
from adx.cli._output import Json, failing, print_json, print_listing
from adx.errors import InvalidInputError

if TYPE_CHECKING:
    from adx.model import EndpointTokenInfo
    from adx.sdk import Tokens

token_app = typer.Typer(
    help="Endpoint tokens: reach one Environment's data plane (or one port) without the API key.",
    no_args_is_help=True,
)
env_app.add_typer(token_app, name="token")


def parse_ttl(text: str) -> float:
    """``3600``, ``45s``, ``10m``, ``1h30m``, ``7d``: seconds until the token expires."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        parsed = parse_duration(value)
        if parsed is None:
            raise InvalidInputError(
                "--ttl", f"must be seconds or a duration (45s, 10m, 1h30m, 7d), got {text!r}"
            ) from None
        seconds = parsed
    if seconds <= 0:
        raise InvalidInputError("--ttl", f"must be positive, got {text!r}")
    return seconds


def _tokens(client: Any, environment_id: str) -> Tokens:
    from adx.sdk import Tokens  # with the client: `adx --help` imports no SDK

    return Tokens(client, environment_id)


def _expiry(info: EndpointTokenInfo) -> str:
    return "never (until revoked)" if info.expires_at is None else format_time(info.expires_at)


@token_app.command("create")
def create(
    environment_id: EnvId,
    port: Annotated[int | None, typer.Option("--port", help="reach only this port's proxy (default: all)")] = None,
    ttl: Annotated[
        str | None, typer.Option("--ttl", help="expires after: seconds or 45s, 10m, 1h30m, 7d (default: never)")
    ] = None,
    as_json: Json = False,
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Issue a token; its secret is printed once (only its hash is kept)."""
    with failing():
        seconds = parse_ttl(ttl) if ttl is not None else None
        with api_client(api_url, api_key) as client:
            tokens = _tokens(client, environment_id)
            token = tokens.create(port=port, ttl=seconds)
            link = tokens.url(token) if token.port is not None else None
    if as_json:
        print_json(token.to_wire())
        return
    scope = "the whole data plane (commands, files, ports)" if token.port is None else f"port {token.port} only"
    console.print(f"token     {token.token}", highlight=False, soft_wrap=True)
    console.print(f"id        {token.id}", highlight=False)
    console.print(f"reaches   {environment_id}: {scope}", highlight=False)
    console.print(f"expires   {_expiry(token)}", highlight=False)
    if link is not None:
        console.print(f"link      {link}", highlight=False, soft_wrap=True)
    console.print("use it as 'Authorization: Bearer <token>' or '?adx_token=<token>' (shown only now)", highlight=False)


@token_app.command("list")
def list_tokens(environment_id: EnvId, as_json: Json = False, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """The Environment's live tokens (IDs, scope, expiry; never their secrets)."""
    print_listing(
        with_api(api_url, api_key, lambda client: _tokens(client, environment_id).list()),
        as_json,
        key="tokens",
        wire=lambda t: t.to_wire(),
        header=("ID", "PORT", "CREATED", "EXPIRES"),
        row=lambda t: (t.id, "all" if t.port is None else str(t.port), format_time(t.created_at), _expiry(t)),
        empty=f"{environment_id} has no endpoint tokens",
    )


@token_app.command("revoke")
def revoke(
    environment_id: EnvId,
    token_id: Annotated[str, typer.Argument(help="the token's ID (tok_...), as `adx env token list` shows")],
    api_url: ApiUrl = None,
    api_key: ApiKey = None,
) -> None:
    """Revoke a token: every Ingress refuses it from now on."""
    with_api(api_url, api_key, lambda client: _tokens(client, environment_id).revoke(token_id))
    console.print(f"revoked {token_id} of {environment_id}", highlight=False)
