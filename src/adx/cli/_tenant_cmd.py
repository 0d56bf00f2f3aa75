"""``adx tenant create|list|disable|enable`` and ``adx key create|revoke|rotate|admin``.

``tenant create`` and ``key admin`` talk to the Coordinator with the API server's certificate (they work before
any admin key exists); the others go through the admin API with the admin key (``_admin_http``)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from pydantic import TypeAdapter

from adx.cli._admin import admin_config
from adx.cli._admin_http import AdminKey, ApiUrl, admin_call, admin_switch, check_name
from adx.cli._app import app, console, err_console
from adx.cli._output import Json, failing, print_json
from adx.errors import UnavailableError
from adx.model import IssuedKey, TenantInfo

if TYPE_CHECKING:
    from adx.gateway import CoordinatorClient

T = TypeVar("T")

tenant_app = typer.Typer(help="Tenants and their API keys.", no_args_is_help=True)
app.add_typer(tenant_app, name="tenant")
key_app = typer.Typer(
    help="API keys: a tenant's (create, revoke, rotate) and admin keys (admin).", no_args_is_help=True
)
app.add_typer(key_app, name="key")

TenantName = Annotated[str, typer.Argument(help="the tenant's name")]
KeyId = Annotated[str, typer.Argument(help="the key's ID (key_...; `adx tenant list` shows them)")]


CoordinatorOption = Annotated[
    str | None,
    typer.Option(
        "--coordinator",
        help="host:port of the Coordinator; several replicas: a:7401,b:7401 (default: the config's)",
    ),
]
CertsDirOption = Annotated[
    Path | None, typer.Option("--certs-dir", help="holds ca.pem and api-<name>.pem/.key", file_okay=False)
]
ApiConfigOption = Annotated[Path | None, typer.Option("--config", help="TOML file of the API server ('api')")]


def _with_coordinator(
    coordinator: str | None,
    certs_dir: Path | None,
    config: Path | None,
    call: Callable[[CoordinatorClient, float], Awaitable[T]],
) -> T:
    """``call(client, timeout)`` on a Coordinator client with the API server's certificate (the cluster's, or
    the flags'); an error ends the command, an unreachable Coordinator's saying how to point at it."""
    from adx.gateway import CoordinatorClient

    with failing():
        cfg = admin_config(coordinator, certs_dir, config)

        async def run() -> T:
            client = CoordinatorClient.from_config(cfg.api)
            try:
                return await call(client, cfg.api.coordinator_timeout_seconds)
            finally:
                await client.close()

        try:
            return asyncio.run(run())
        except UnavailableError as exc:
            raise UnavailableError(f"{exc}; {cfg.reach_fix}", details=exc.details) from None


@tenant_app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="tenant name: 1-64 letters, digits, '-' or '_'")],
    coordinator: CoordinatorOption = None,
    certs_dir: CertsDirOption = None,
    config: ApiConfigOption = None,
) -> None:
    """Create tenant NAME (or add a key to it) and print its new API key (shown once; only its hash is kept).

    The Coordinator and certificates are those of the cluster `adx up` recorded, unless --coordinator,
    --certs-dir, --config (or ADX_API__COORDINATOR / ADX_API__CERTS_DIR) say otherwise."""
    key = _with_coordinator(coordinator, certs_dir, config, lambda client, _: client.create_tenant(name))
    # The key alone on stdout (scripts capture it); the advice on stderr.
    console.print(key, soft_wrap=True, highlight=False, markup=False)
    err_console.print(f"tenant {name}: new API key (use it as ADX_API_KEY; it is not shown again)", highlight=False)


@tenant_app.command("list")
def list_(as_json: Json = False, api_url: ApiUrl = None, admin_key: AdminKey = None) -> None:
    """List tenants: created, enabled or disabled, their keys' IDs."""
    from adx.cli._human import format_time, table

    tenants = admin_call(api_url, admin_key, "GET", "/v1/admin/tenants", "list tenants")
    if as_json:
        print_json(tenants)
        return
    rows = [
        (
            t.name,
            "disabled" if t.disabled else "enabled",
            format_time(t.created_at),
            ",".join(k.id for k in t.keys) or "-",
        )
        for t in TypeAdapter(list[TenantInfo]).validate_python(tenants)
    ]
    sys.stdout.write(table(("NAME", "STATUS", "CREATED", "KEYS"), rows))


@tenant_app.command("disable")
def disable(name: TenantName, api_url: ApiUrl = None, admin_key: AdminKey = None) -> None:
    """Disable tenant NAME: its API keys are refused (401); its Environments are left as they are."""
    admin_switch(
        api_url,
        admin_key,
        "tenant",
        name,
        "disable",
        "disabled: its API keys are refused; its Environments are left as they are",
        field="name",
    )


@tenant_app.command("enable")
def enable(name: TenantName, api_url: ApiUrl = None, admin_key: AdminKey = None) -> None:
    """Enable a disabled tenant again."""
    admin_switch(api_url, admin_key, "tenant", name, "enable", "enabled: its API keys work again", field="name")


def _print_issued(answer: object, what: str) -> None:
    # The key alone on stdout (scripts capture it); the rest on stderr.
    issued = IssuedKey.model_validate(answer)
    console.print(issued.api_key, soft_wrap=True, highlight=False, markup=False)
    err_console.print(
        f"tenant {issued.owner}: {what} {issued.key_id} (use it as ADX_API_KEY; it is not shown again)",
        highlight=False,
    )


@key_app.command("create")
def key_create(tenant: TenantName, api_url: ApiUrl = None, admin_key: AdminKey = None) -> None:
    """Add an API key to TENANT and print it (shown once)."""
    issued = admin_call(
        api_url,
        admin_key,
        "POST",
        f"/v1/admin/tenants/{check_name('tenant', tenant)}/keys",
        f"create a key of {tenant}",
    )
    _print_issued(issued, "new API key")


@key_app.command("revoke")
def key_revoke(tenant: TenantName, key_id: KeyId, api_url: ApiUrl = None, admin_key: AdminKey = None) -> None:
    """Revoke KEY_ID of TENANT: refused from now on."""
    admin_call(
        api_url,
        admin_key,
        "DELETE",
        f"/v1/admin/tenants/{check_name('tenant', tenant)}/keys/{check_name('key_id', key_id)}",
        f"revoke key {key_id}",
    )
    console.print(f"tenant {tenant}: key {key_id} revoked")


@key_app.command("rotate")
def key_rotate(tenant: TenantName, key_id: KeyId, api_url: ApiUrl = None, admin_key: AdminKey = None) -> None:
    """Replace KEY_ID of TENANT with a new key (printed once); the old one is refused from then on."""
    issued = admin_call(
        api_url,
        admin_key,
        "POST",
        f"/v1/admin/tenants/{check_name('tenant', tenant)}/keys/{check_name('key_id', key_id)}/rotate",
        f"rotate key {key_id}",
    )
    _print_issued(issued, f"key {key_id} replaced by")


@key_app.command("admin")
def key_admin(
    name: Annotated[str, typer.Option("--name", help="names the admin key (1-64 letters, digits, '-', '_')")] = "admin",
    coordinator: CoordinatorOption = None,
    certs_dir: CertsDirOption = None,
    config: ApiConfigOption = None,
) -> None:
    """Create an admin key and print it (shown once; only its hash is kept): for a cluster not started by
    `adx up` (docs/deploy.md). Like `tenant create`, it talks to the Coordinator with the API server's
    certificate, so it works before any admin key exists; use the key as ADX_ADMIN_KEY."""
    from adx.proto import coordinator_pb2 as pb

    with failing():
        check_name("--name", name)

    async def make(client: CoordinatorClient, rpc_seconds: float) -> IssuedKey:
        request = pb.CreateAdminKeyRequest(name=name)
        reply = await client.call(
            "create admin key", lambda: client.admin.CreateAdminKey(request, timeout=rpc_seconds), reads=False
        )
        return IssuedKey.model_validate_json(reply.json)

    issued = _with_coordinator(coordinator, certs_dir, config, make)
    console.print(issued.api_key, soft_wrap=True, highlight=False, markup=False)
    err_console.print(
        f"admin {issued.owner}: new admin key {issued.key_id} (use it as ADX_ADMIN_KEY; it is not shown again)",
        highlight=False,
    )
