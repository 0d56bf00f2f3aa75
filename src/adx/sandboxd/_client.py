"""Typed async client of sandboxd (what the adxlet's sandboxd RuntimeDriver uses).

Errors come back as the ``adx.errors`` family named by the server's error code. Losing the connection after
a request was sent is an :class:`UncertainOutcomeError` (SBX-6: lost IPC is "uncertain", never "missing");
failing to connect at all is :class:`UnavailableError` (nothing happened).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from adx.errors import (
    AdxError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    UnavailableError,
    UncertainOutcomeError,
)
from adx.sandboxd._errors import PermissionDeniedError
from adx.sandboxd._models import (
    CheckpointInfo,
    CheckpointRef,
    CheckpointRequest,
    CreateRequest,
    CreateResponse,
    DeleteResponse,
    Health,
    ListResponse,
    ResourceInfo,
    RestoreRequest,
    SandboxInfo,
    SandboxRef,
    Stats,
    WaitRequest,
    WaitResponse,
)

__all__ = ["SandboxdClient", "ref_of"]

M = TypeVar("M", bound=BaseModel)

_SIMPLE: dict[str, type[AdxError]] = {
    "not_found": NotFoundError,
    "conflict": ConflictError,
    "unavailable": UnavailableError,
    "uncertain_outcome": UncertainOutcomeError,
    "permission_denied": PermissionDeniedError,
}


def _to_error(status: int, body: bytes) -> AdxError:
    try:
        err = httpx.Response(status, content=body).json()["error"]
        code, message, details = err.get("code", ""), err.get("message", ""), err.get("details") or {}
    except Exception:
        return UncertainOutcomeError(f"sandboxd answered {status} with an unreadable body")
    if code in ("invalid_input", "invalid_config"):
        return InvalidInputError(details.get("field", ""), details.get("reason", message), details=details)
    family = _SIMPLE.get(code, AdxError)
    return family(message, details=details)


def ref_of(created: CreateResponse) -> SandboxRef:
    """The credentials of a created sandbox for later per-sandbox calls."""
    s = created.sandbox
    return SandboxRef(sandbox_id=s.sandbox_id, generation=s.generation, token=created.token, owner=s.owner)


class SandboxdClient:
    """``async with SandboxdClient(socket_path) as c: created = await c.create(CreateRequest(...))``."""

    def __init__(self, socket_path: Path | str, timeout: float = 60.0) -> None:
        self.socket_path = str(socket_path)
        self._timeout = timeout
        self._http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=self.socket_path),
            base_url="http://sandboxd",
            timeout=timeout,
        )

    async def __aenter__(self) -> SandboxdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, name: str, body: BaseModel | None, out: type[M], call_timeout: float | None = None) -> M:
        content = body.model_dump_json().encode() if body is not None else b"{}"
        try:
            resp = await self._http.post(
                f"/v1/{name}",
                content=content,
                headers={"content-type": "application/json"},
                timeout=call_timeout if call_timeout is not None else self._timeout,
            )
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError) as exc:
            raise UnavailableError(f"sandboxd at {self.socket_path} is not reachable: {exc}") from exc
        except httpx.TransportError as exc:
            raise UncertainOutcomeError(f"sandboxd {name}: connection lost after sending ({exc!r})") from exc
        if resp.status_code != 200:
            raise _to_error(resp.status_code, resp.content)
        return out.model_validate_json(resp.content)

    # -- calls ---------------------------------------------------------------------------------------
    async def create(self, request: CreateRequest) -> CreateResponse:
        return await self._call("Create", request, CreateResponse, call_timeout=self._timeout * 2)

    async def get(self, ref: SandboxRef) -> SandboxInfo:
        return await self._call("Get", ref, SandboxInfo)

    async def list(self) -> list[SandboxInfo]:
        return (await self._call("List", None, ListResponse)).sandboxes

    async def delete(self, ref: SandboxRef) -> DeleteResponse:
        return await self._call("Delete", ref, DeleteResponse, call_timeout=self._timeout * 2)

    async def wait(self, ref: SandboxRef, timeout_seconds: float = 3600.0) -> WaitResponse:
        """Long wait for the workload to end; ``done`` is False when ``timeout_seconds`` passed first."""
        req = WaitRequest(ref=ref, timeout_seconds=timeout_seconds)
        return await self._call("Wait", req, WaitResponse, call_timeout=timeout_seconds + 30.0)

    async def stats(self, ref: SandboxRef) -> Stats:
        return await self._call("Stats", ref, Stats)

    async def resource(self) -> ResourceInfo:
        return await self._call("Resource", None, ResourceInfo)

    async def health(self) -> Health:
        return await self._call("Health", None, Health)

    async def pause(self, ref: SandboxRef) -> SandboxInfo:
        """Freeze the sandbox's processes in place (no checkpoint); ``resume`` thaws them."""
        return await self._call("Pause", ref, SandboxInfo)

    async def resume(self, ref: SandboxRef) -> SandboxInfo:
        return await self._call("Resume", ref, SandboxInfo)

    async def checkpoint(
        self, ref: SandboxRef, storage: str = "local", leave_running: bool = True, call_timeout: float = 600.0
    ) -> CheckpointInfo:
        req = CheckpointRequest(ref=ref, storage=storage, leave_running=leave_running)
        return await self._call("Checkpoint", req, CheckpointInfo, call_timeout=call_timeout)

    async def delete_checkpoint(self, location: str, digest: str) -> None:
        """Remove an artifact (idempotent); the digest must match its manifest."""
        await self._call("DeleteCheckpoint", CheckpointRef(location=location, digest=digest), CheckpointRef)

    async def restore(self, request: RestoreRequest, call_timeout: float = 600.0) -> CreateResponse:
        return await self._call("Restore", request, CreateResponse, call_timeout=call_timeout)

    async def raw(self, name: str, payload: dict[str, Any]) -> httpx.Response:
        """Low-level call (tests use it to send malformed requests)."""
        return await self._http.post(f"/v1/{name}", json=payload)
