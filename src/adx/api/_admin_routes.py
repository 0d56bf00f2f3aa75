"""Admin routes (``/v1/admin/...``): tenants and their keys, nodes (list, cordon, drain) and the cluster's status.

They authenticate the admin key (``adx up`` prints it once and saves it as ``admin.json`` beside the tenant
credentials); a tenant's API key is refused with 403 saying so. The Coordinator's ``CoordinatorAdmin`` service
does the work; this module checks the caller and translates.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, TypeVar

import grpc
from fastapi import APIRouter, Depends, Path, Request, Security
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from google.protobuf.message import Message
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue

from adx.errors import AdxError, ForbiddenError, NotFoundError
from adx.gateway import OpenApiResponses, Plane, Unauthenticated, error_answer, plane
from adx.model import ADMIN_KEY_PREFIX, AdminIdentity, ClusterStatus, DrainEvent, IssuedKey, NodeInfo, TenantInfo
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc as pb_grpc

log = logging.getLogger("adx.api")

M = TypeVar("M", bound=BaseModel)
Req = TypeVar("Req", bound=Message)

admin_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="AdminKey",
    description="the admin key (`adx up` prints it once and saves it in STATE_DIR/admin.json); not a tenant key",
)
AdminCredentials = Annotated[HTTPAuthorizationCredentials | None, Security(admin_bearer)]

ADMIN_ERRORS: OpenApiResponses = {
    401: error_answer("missing or unknown admin key"),
    403: error_answer("a tenant's API key: admin routes need the admin key"),
    404: error_answer("no such tenant, key or node"),
    409: error_answer("conflict, e.g. the tenant exists"),
    422: error_answer("invalid input; details.field names it"),
    503: error_answer("the Coordinator is unavailable"),
}

#: A drain waits for every pause (each bounded by its Environment's pause timeout).
DRAIN_TIMEOUT_SECONDS = 3700.0

ADMIN_KEY_FIX = "use the admin key: `adx up` saved it in STATE_DIR/admin.json (the adx CLI reads it by itself)"


@dataclass(frozen=True)
class AdminService:
    """The Coordinator's admin service, reached through the plane's client (its error translation, its timeout)."""

    plane: Plane

    @property
    def rpc(self) -> pb_grpc.CoordinatorAdminAsyncStub:
        return self.plane.coordinator.admin

    async def one(
        self,
        what: str,
        model: type[M],
        rpc: grpc.aio.UnaryUnaryMultiCallable[Req, pb.AdminReply],
        request: Req,
        *,
        reads: bool = False,
    ) -> M:
        """One admin RPC (``self.rpc.X``) whose reply is one ``model`` as JSON."""
        p = self.plane
        reply = await p.coordinator.call(what, lambda: rpc(request, timeout=_timeout(p)), reads=reads)
        return model.model_validate_json(reply.json)

    async def listed(
        self, what: str, model: type[M], rpc: grpc.aio.UnaryUnaryMultiCallable[pb.AdminEmpty, pb.AdminListReply]
    ) -> list[M]:
        """One admin list RPC: each item of its reply is one ``model`` as JSON."""
        p = self.plane
        reply = await p.coordinator.call(what, lambda: rpc(pb.AdminEmpty(), timeout=_timeout(p)), reads=True)
        return [model.model_validate_json(item) for item in reply.json]


@dataclass(frozen=True)
class AdminCall(AdminService):
    """An admin's request: the admin service, and who asks (the logs name it)."""

    who: AdminIdentity


def _timeout(p: Plane) -> float:
    return p.config.coordinator_timeout_seconds


async def admin(request: Request, credentials: AdminCredentials) -> AdminCall:
    """The admin behind the request; 401 for no or an unknown key, 403 for a tenant's key."""
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise Unauthenticated(f"missing 'Authorization: Bearer <admin key>'; {ADMIN_KEY_FIX}")
    key = credentials.credentials.strip()
    p = plane(request)
    service = AdminService(p)
    asked = pb.AuthenticateAdminRequest(api_key=key)
    try:
        who = await service.one("authenticate admin", AdminIdentity, service.rpc.AuthenticateAdmin, asked, reads=True)
    except NotFoundError:
        pass
    else:
        return AdminCall(p, who)
    if not key.startswith(ADMIN_KEY_PREFIX):
        # Tell a tenant key apart from garbage, so the caller learns which credential to use instead.
        try:
            tenant = await p.coordinator.authenticate(key)
        except (NotFoundError, AdxError):
            tenant = None
        if tenant is not None:
            raise ForbiddenError(
                "Authorization", f"this is an API key of tenant {tenant}, not the admin key; {ADMIN_KEY_FIX}"
            )
    raise Unauthenticated(f"unknown admin key; {ADMIN_KEY_FIX}")


Admin = Annotated[AdminCall, Depends(admin)]
#: What the Coordinator takes as a key's ID (``key_`` and 12 hex digits): the schema says it too.
KeyId = Annotated[str, Path(pattern=r"^key_[0-9a-f]{12}$", description="a key's ID (`adx tenant list` shows them)")]

router = APIRouter(tags=["admin"], prefix="/v1/admin", responses=ADMIN_ERRORS)


class _Body(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class CreateTenantBody(_Body):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$", description="the tenant's name")


@router.post("/tenants", status_code=201, response_model=IssuedKey, summary="Create a tenant and its first API key")
async def create_tenant(body: CreateTenantBody, admin: Admin) -> IssuedKey:
    issued = await admin.one("create tenant", IssuedKey, admin.rpc.CreateTenant, pb.TenantRequest(name=body.name))
    log.info("admin: tenant created", extra={"tenant": body.name, "admin": admin.who.name})
    return issued


@router.get("/tenants", response_model=list[TenantInfo], summary="List tenants with their keys' IDs")
async def list_tenants(admin: Admin) -> list[TenantInfo]:
    return await admin.listed("list tenants", TenantInfo, admin.rpc.ListTenants)


async def _set_disabled(admin: AdminCall, name: str, disabled: bool) -> TenantInfo:
    what = "disable tenant" if disabled else "enable tenant"
    change = pb.SetTenantDisabledRequest(name=name, disabled=disabled)
    tenant = await admin.one(what, TenantInfo, admin.rpc.SetTenantDisabled, change)
    admin.plane.auth.forget_all()  # this replica refuses the tenant's keys from now on
    log.info("admin: tenant %s", "disabled" if disabled else "enabled", extra={"tenant": name, "admin": admin.who.name})
    return tenant


@router.post(
    "/tenants/{name}/disable",
    response_model=TenantInfo,
    summary="Disable a tenant: its keys are refused; its Environments are left as they are",
)
async def disable_tenant(name: str, admin: Admin) -> TenantInfo:
    return await _set_disabled(admin, name, True)


@router.post("/tenants/{name}/enable", response_model=TenantInfo, summary="Enable a disabled tenant again")
async def enable_tenant(name: str, admin: Admin) -> TenantInfo:
    return await _set_disabled(admin, name, False)


@router.post("/tenants/{name}/keys", status_code=201, response_model=IssuedKey, summary="Add an API key to a tenant")
async def create_key(name: str, admin: Admin) -> IssuedKey:
    issued = await admin.one("create key", IssuedKey, admin.rpc.CreateKey, pb.TenantRequest(name=name))
    log.info("admin: key created", extra={"tenant": name, "key_id": issued.key_id, "admin": admin.who.name})
    return issued


@router.delete(
    "/tenants/{name}/keys/{key_id}", response_model=TenantInfo, summary="Revoke an API key (refused from now on)"
)
async def revoke_key(name: str, key_id: KeyId, admin: Admin) -> TenantInfo:
    tenant = await admin.one("revoke key", TenantInfo, admin.rpc.RevokeKey, pb.KeyRequest(tenant=name, key_id=key_id))
    admin.plane.auth.forget_all()
    log.info("admin: key revoked", extra={"tenant": name, "key_id": key_id, "admin": admin.who.name})
    return tenant


@router.post(
    "/tenants/{name}/keys/{key_id}/rotate",
    response_model=IssuedKey,
    summary="Replace an API key with a new one in one step (the old one is refused from then on)",
)
async def rotate_key(name: str, key_id: KeyId, admin: Admin) -> IssuedKey:
    issued = await admin.one("rotate key", IssuedKey, admin.rpc.RotateKey, pb.KeyRequest(tenant=name, key_id=key_id))
    admin.plane.auth.forget_all()
    log.info("admin: key rotated", extra={"tenant": name, "key_id": key_id, "admin": admin.who.name})
    return issued


# -- nodes and the cluster ------------------------------------------------------------------------------
@router.get("/nodes", response_model=list[NodeInfo], summary="List nodes: capacity, allocatable, admission, health")
async def list_nodes(admin: Admin) -> list[NodeInfo]:
    return await admin.listed("list nodes", NodeInfo, admin.rpc.ListNodes)


async def _cordon(admin: AdminCall, node: str, cordoned: bool) -> NodeInfo:
    what = "cordon node" if cordoned else "uncordon node"
    change = pb.SetNodeCordonedRequest(node=node, cordoned=cordoned)
    info = await admin.one(what, NodeInfo, admin.rpc.SetNodeCordoned, change)
    log.info("admin: node %s", "cordoned" if cordoned else "uncordoned", extra={"node": node, "admin": admin.who.name})
    return info


@router.post(
    "/nodes/{node}/cordon", response_model=NodeInfo, summary="Cordon a node: it admits no new or resumed Environment"
)
async def cordon_node(node: str, admin: Admin) -> NodeInfo:
    return await _cordon(admin, node, True)


@router.post("/nodes/{node}/uncordon", response_model=NodeInfo, summary="Let a cordoned node admit again")
async def uncordon_node(node: str, admin: Admin) -> NodeInfo:
    return await _cordon(admin, node, False)


def _inline_schema(model: type[BaseModel]) -> JsonSchemaValue:
    """``model``'s JSON schema with its ``$defs`` put in place: a schema inside an OpenAPI document cannot point
    at ``#/$defs/...`` (that resolves against the document's root)."""
    schema = model.model_json_schema(by_alias=True)
    defs = schema.pop("$defs", {})
    for prop in schema.get("properties", {}).values():
        ref = prop.pop("$ref", None)
        if ref is not None:
            prop.update(defs[ref.rsplit("/", 1)[-1]])
    return schema


@router.post(
    "/nodes/{node}/drain",
    summary="Drain a node: cordon it, then pause every running Environment of it (they resume elsewhere)",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "progress, one DrainEvent JSON object per line (application/x-ndjson); the last has "
            "step 'done'",
            "content": {"application/x-ndjson": {"schema": _inline_schema(DrainEvent)}},
        }
    },
)
async def drain_node(node: str, admin: Admin) -> StreamingResponse:
    p = admin.plane
    stream = admin.rpc.DrainNode(pb.NodeRequest(node=node), timeout=DRAIN_TIMEOUT_SECONDS)
    events = aiter(stream)
    # The first event (the cordon) before answering: an unknown node is a 404, not a stream.
    first = await p.coordinator.call("drain node", lambda: anext(events), reads=False)
    log.info("admin: node drain started", extra={"node": node, "admin": admin.who.name})

    async def lines() -> AsyncIterator[bytes]:
        yield first.json.encode() + b"\n"
        try:
            while True:
                try:
                    reply = await p.coordinator.call("drain node", lambda: anext(events), reads=False)
                except StopAsyncIteration:
                    return
                yield reply.json.encode() + b"\n"
        except AdxError as exc:
            # The answer has started: the failure is the last line, in the error body's shape.
            yield (
                json.dumps({"error": {"code": exc.code, "message": str(exc), "details": exc.details}}).encode() + b"\n"
            )
        finally:
            stream.cancel()

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.get("/cluster", response_model=ClusterStatus, summary="The cluster: nodes, Environments by state, leader")
async def cluster_status(admin: Admin) -> ClusterStatus:
    return await admin.one("cluster status", ClusterStatus, admin.rpc.ClusterStatus, pb.AdminEmpty(), reads=True)
