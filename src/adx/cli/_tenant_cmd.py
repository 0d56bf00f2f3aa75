"""``adx tenant create|list|disable|enable`` and ``adx key create|revoke|rotate|admin``.

``tenant create`` and ``key admin`` talk to the Coordinator with the API server's certificate (they work before
any admin key exists); the others go through the admin API with the admin key (``_admin_http``)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated

import typer

from adx.cli._admin import admin_config
from adx.cli._admin_http import AdminKey, ApiUrl, admin_call, check_name
from adx.cli._app import app, console, err_console, fail
from adx.cli._output import Json, print_json
from adx.errors import AdxError, UnavailableError

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
    from adx.gateway import CoordinatorClient

    try:
        cfg = admin_config(coordinator, certs_dir, config)

        async def make() -> str:
            client = CoordinatorClient.from_config(cfg.api)
            try:
                return await client.create_tenant(name)
            finally:
                await client.close()

        try:
            key = asyncio.run(make())
        except UnavailableError as exc:
            raise UnavailableError(f"{exc}; {cfg.reach_fix}", details=exc.details) from None
    except AdxError as exc:
        fail(exc)
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
            t["name"],
            "disabled" if t["disabled"] else "enabled",
            format_time(t["createdAt"]),
            ",".join(k["id"] for k in t["keys"]) or "-",
        )
        for t in tenants
    ]
    sys.stdout.write(table(("NAME", "STATUS", "CREATED", "KEYS"), rows))


def _set_disabled(name: str, disabled: bool, api_url: str | None, admin_key: str | None) -> None:
    verb = "disable" if disabled else "enable"
    admin_call(
        api_url, admin_key, "POST", f"/v1/admin/tenants/{check_name('name', name)}/{verb}", f"{verb} tenant {name}"
    )
    if disabled:
        console.print(f"tenant {name} disabled: its API keys are refused; its Environments are left as they are")
    else:
        console.print(f"tenant {name} enabled: its API keys work again")


@tenant_app.command("disable")
def disable(name: TenantName, api_url: ApiUrl = None, admin_key: AdminKey = None) -> None:
    """Disable tenant NAME: its API keys are refused (401); its Environments are left as they are."""
    _set_disabled(name, True, api_url, admin_key)


@tenant_app.command("enable")
def enable(name: TenantName, api_url: ApiUrl = None, admin_key: AdminKey = None) -> None:
    """Enable a disabled tenant again."""
    _set_disabled(name, False, api_url, admin_key)


def _print_issued(issued: dict[str, str], what: str) -> None:
    # The key alone on stdout (scripts capture it); the rest on stderr.
    console.print(issued["apiKey"], soft_wrap=True, highlight=False, markup=False)
    err_console.print(
        f"tenant {issued['owner']}: {what} {issued['keyId']} (use it as ADX_API_KEY; it is not shown again)",
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
    from adx.gateway import CoordinatorClient
    from adx.model import IssuedKey
    from adx.proto import coordinator_pb2 as pb

    try:
        check_name("--name", name)
        cfg = admin_config(coordinator, certs_dir, config)

        async def make() -> IssuedKey:
            client = CoordinatorClient.from_config(cfg.api)
            try:
                reply = await client.call(
                    "create admin key",
                    lambda: client.admin.CreateAdminKey(
                        pb.CreateAdminKeyRequest(name=name), timeout=cfg.api.coordinator_timeout_seconds
                    ),
                    reads=False,
                )
            finally:
                await client.close()
            return IssuedKey.model_validate_json(reply.json)

        try:
            issued = asyncio.run(make())
        except UnavailableError as exc:
            raise UnavailableError(f"{exc}; {cfg.reach_fix}", details=exc.details) from None
    except AdxError as exc:
        fail(exc)
    console.print(issued.api_key, soft_wrap=True, highlight=False, markup=False)
    err_console.print(
        f"admin {issued.owner}: new admin key {issued.key_id} (use it as ADX_ADMIN_KEY; it is not shown again)",
        highlight=False,
    )
