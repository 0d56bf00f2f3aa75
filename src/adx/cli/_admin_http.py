"""How the admin commands (``adx tenant list``, ``adx key ...``, ``adx node list|cordon|drain``, ``adx cluster
status``) reach the admin API: over HTTP with the admin key, both found by themselves.

The API URL: ``--api-url``, else ``ADX_API_URL``, else the recorded cluster (``adx --cluster`` or the last
``adx up``). The admin key: ``--admin-key``, else ``ADX_ADMIN_KEY``, else the cluster's ``STATE_DIR/admin.json``,
else the user's ``$XDG_CONFIG_HOME/adx/admin.json`` (both written by ``adx up``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from adx.cli._app import GlobalOptions, console
from adx.cli._cluster import NO_CLUSTER_FIX, find_cluster, user_cluster_file
from adx.cli._output import failing
from adx.errors import AdxError, AuthenticationError, InvalidInputError, NotFoundError, UnavailableError

if TYPE_CHECKING:
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")

ADMIN_FILE = "admin.json"
ENV_ADMIN_KEY = "ADX_ADMIN_KEY"

ApiUrl = Annotated[str | None, typer.Option("--api-url", help="default: ADX_API_URL or the recorded cluster's")]
AdminKey = Annotated[
    str | None,
    typer.Option("--admin-key", help=f"default: {ENV_ADMIN_KEY} or the admin.json `adx up` saved"),
]


def _read_key(path: Path) -> str | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    key = data.get("admin_key") if isinstance(data, dict) else None
    return key if isinstance(key, str) and key else None


@dataclass
class AdminHttp:
    api_url: str
    admin_key: str
    key_source: str  # where the key came from, for the message of a refusal

    @classmethod
    def find(cls, api_url: str | None = None, admin_key: str | None = None) -> AdminHttp:
        cluster = find_cluster(GlobalOptions.cluster)
        url = api_url or os.environ.get("ADX_API_URL") or (cluster.api_url if cluster else None)
        if not url:
            raise NotFoundError(f"no API URL: pass --api-url or set ADX_API_URL, or {NO_CLUSTER_FIX}")
        source = "--admin-key"
        key = admin_key
        if key is None and (key := os.environ.get(ENV_ADMIN_KEY) or None) is not None:
            source = ENV_ADMIN_KEY
        if key is None and cluster is not None:
            path = cluster.state_dir / ADMIN_FILE
            key, source = _read_key(path), str(path)
        if key is None:
            path = user_cluster_file().with_name(ADMIN_FILE)
            key, source = _read_key(path), str(path)
        if key is None:
            raise NotFoundError(
                f"no admin key: pass --admin-key or set {ENV_ADMIN_KEY}; `adx up` saves it in STATE_DIR/{ADMIN_FILE}"
                + (f" (none in {cluster.state_dir})" if cluster is not None else f"; {NO_CLUSTER_FIX}")
            )
        return cls(url.rstrip("/"), key, source)

    def _fail(self, response: Any, what: str) -> AdxError:
        from adx.sdk._errors import error_from_response

        try:
            error = response.json()["error"]
            message = str(error["message"])
        except (ValueError, KeyError, TypeError):
            message = response.text[:300] or f"HTTP {response.status_code}"
        if response.status_code in (401, 403):
            return AuthenticationError(
                "admin key",
                f"{self.api_url} refused the admin key from {self.key_source} ({message}); use the admin key of "
                f"this cluster (`adx up` saved it in STATE_DIR/{ADMIN_FILE})",
            )
        return error_from_response("POST", response.status_code, response.content, what, self.api_url)

    def _client(self, timeout: float | None) -> Any:
        import httpx

        return httpx.Client(
            base_url=self.api_url, headers={"Authorization": f"Bearer {self.admin_key}"}, timeout=timeout
        )

    def request(self, method: str, path: str, what: str) -> object:
        """The answer's JSON (``--json`` prints it as it is; the text output parses it with its model)."""
        import httpx

        try:
            with self._client(30.0) as client:
                response = client.request(method, path)
        except httpx.TransportError as exc:
            raise UnavailableError(f"{what}: cannot reach the ADX API at {self.api_url}: {exc}") from None
        if response.status_code >= 400:
            raise self._fail(response, what)
        return response.json()

    def stream(self, path: str, what: str, model: type[M]) -> Iterator[M]:
        """POST ``path`` and yield each JSON line of the answer, as ``model``, as it comes (a drain's progress)."""
        import httpx

        try:
            with self._client(None) as client, client.stream("POST", path) as response:
                if response.status_code >= 400:
                    response.read()
                    raise self._fail(response, what)
                for line in response.iter_lines():
                    if line.strip():
                        item = json.loads(line)
                        if "error" in item:
                            error = item["error"]
                            raise UnavailableError(f"{what}: {error.get('message', error)}")
                        yield model.model_validate(item)
        except httpx.TransportError as exc:
            raise UnavailableError(f"{what}: the ADX API at {self.api_url} went away: {exc}") from None


def check_name(field: str, value: str) -> str:
    if not value or len(value) > 64 or not all(c.isascii() and (c.isalnum() or c in "-_.") for c in value):
        raise InvalidInputError(field, "must be 1-64 letters, digits, '-', '_' or '.'")
    return value


def admin_switch(
    api_url: str | None, admin_key: str | None, kind: str, name: str, verb: str, done: str, *, field: str = ""
) -> None:
    """Switch a node or tenant (``POST /v1/admin/{kind}s/NAME/VERB``: cordon, enable, ...) and print
    ``KIND NAME DONE``; ``field`` names the argument in an error about NAME (default: ``kind``)."""
    path = f"/v1/admin/{kind}s/{check_name(field or kind, name)}/{verb}"
    admin_call(api_url, admin_key, "POST", path, f"{verb} {kind} {name}")
    console.print(f"{kind} {name} {done}")


def admin_call(api_url: str | None, admin_key: str | None, method: str, path: str, what: str) -> object:
    """One admin request of a command: its answer, or the command ends with the error (and its exit status)."""
    with failing():
        return AdminHttp.find(api_url, admin_key).request(method, path, what)
