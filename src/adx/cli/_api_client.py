"""How the tenant commands (``adx env ...``, ``adx volume ...``, ``adx env token ...``) reach the API: the SDK
client, its URL and key found by themselves, and one call through it that ends the command on an error."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from adx.cli._app import GlobalOptions
from adx.cli._cluster import find_cluster
from adx.cli._output import failing

T = TypeVar("T")

ApiUrl = Annotated[str | None, typer.Option("--api-url", help="default: ADX_API_URL or the `adx up` credentials")]
ApiKey = Annotated[str | None, typer.Option("--api-key", help="default: ADX_API_KEY or the `adx up` credentials")]


def api_client(api_url: str | None, api_key: str | None) -> Any:
    """The SDK client: the flags, else ADX_API_URL/ADX_API_KEY, else the recorded cluster (``adx --cluster``
    or the last ``adx up``), else the SDK's own credentials file."""
    # Start time (docs/cli.md): httpx imports its own command line (click, rich, pygments) and httpcore its
    # HTTP/2 support (h2, hpack) whenever they are installed; this process runs neither (the SDK speaks
    # HTTP/1.1). A None entry makes those optional imports fail, as if the extras were not installed.
    for optional in ("httpx._main", "h2"):
        sys.modules.setdefault(optional, None)  # type: ignore[arg-type]
    import adx

    if api_url is None and not os.environ.get("ADX_API_URL"):
        cluster = find_cluster(GlobalOptions.cluster)
        if cluster is not None:
            api_url = cluster.api_url
            if api_key is None and not os.environ.get("ADX_API_KEY"):
                api_key = cluster.api_key()
    return adx.Client(api_url=api_url, api_key=api_key)


def with_api(api_url: str | None, api_key: str | None, call: Callable[[Any], T]) -> T:
    """``call(client)`` on a client that is closed after it; an ``AdxError`` ends the command."""
    with failing(), api_client(api_url, api_key) as client:
        return call(client)
