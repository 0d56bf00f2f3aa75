"""The Coordinator's endpoint-token gRPC service (``CoordinatorTokens``, SEC-4): API servers create, list and revoke
tokens for a tenant they authenticated; Ingresses check a request's token (and cache the answer briefly)."""

from __future__ import annotations

import asyncio
import json
import logging

import grpc

from adx._grpc_serve import serve
from adx.coordinator._service import CoordinatorService
from adx.coordinator._sweeps import sweep_every
from adx.coordinator._token_store import TokenStore
from adx.errors import InvalidInputError, NotFoundError
from adx.model import EndpointTokenInfo, EndpointTokenRequest, TokenGrant, is_endpoint_token_id, parse_wire
from adx.proto import tokens_pb2 as pb
from adx.proto import tokens_pb2_grpc as pb_grpc

log = logging.getLogger("adx.coordinator")

Context = grpc.aio.ServicerContext[object, object]
#: How often the tokens of deleted Environments are reclaimed (a SCAN of the token indexes).
TOKEN_SWEEP_SECONDS = 60.0


class CoordinatorTokensService(pb_grpc.CoordinatorTokensServicer):
    def __init__(self, service: CoordinatorService) -> None:
        self.service = service
        self.tokens = TokenStore(service.store)

    async def _owned(self, tenant: str, env_id: str) -> None:
        # Another tenant's Environment is indistinguishable from none (SEC-2).
        await self.service.store.get_tenant_environment(tenant, env_id)

    async def CreateToken(self, request: pb.CreateTokenRequest, context: Context) -> pb.TokenReply:
        async def work() -> str:
            try:
                body = json.loads(request.request_json or "{}")
            except ValueError as exc:
                raise InvalidInputError("body", f"is not valid JSON: {exc}") from None
            spec = parse_wire(EndpointTokenRequest, body, root="")
            issued = await self.tokens.create(request.tenant, request.environment_id, spec)
            return _logged("created", request.tenant, issued)

        return pb.TokenReply(json=await serve(context, work, "api"))

    async def ListTokens(self, request: pb.EnvironmentTokensRequest, context: Context) -> pb.TokenListReply:
        async def work() -> list[str]:
            await self._owned(request.tenant, request.environment_id)
            tokens = await self.tokens.list(request.environment_id)
            return [t.model_dump_json(by_alias=True) for t in tokens]

        return pb.TokenListReply(json=await serve(context, work, "api"))

    async def RevokeToken(self, request: pb.RevokeTokenRequest, context: Context) -> pb.TokenReply:
        async def work() -> str:
            if not is_endpoint_token_id(request.token_id):
                raise InvalidInputError("tokenId", "must look like tok_0123456789ab (listing the tokens shows them)")
            await self._owned(request.tenant, request.environment_id)
            revoked = await self.tokens.revoke(request.environment_id, request.token_id)
            return _logged("revoked", request.tenant, revoked)

        return pb.TokenReply(json=await serve(context, work, "api"))

    async def CheckToken(self, request: pb.CheckTokenRequest, context: Context) -> pb.TokenReply:
        async def work() -> TokenGrant:
            grant = await self.tokens.check(request.token)
            if await self.service.admin.tenant_disabled(grant.tenant):
                # NOT_FOUND, like an unknown token (the Ingress answers 401): an UNAUTHENTICATED status would read
                # as the Coordinator refusing the API server's own certificate.
                raise NotFoundError(f"endpoint token {grant.token_id}: its tenant {grant.tenant} is disabled")
            return grant

        grant = await serve(context, work, "api")
        return pb.TokenReply(json=grant.model_dump_json(by_alias=True))

    async def run_sweeps(self, interval: float, stop: asyncio.Event) -> None:
        """Reclaim deleted Environments' tokens every ``interval`` seconds until ``stop``."""
        await sweep_every(
            interval,
            stop,
            self.tokens.sweep,
            what="endpoint token sweep",
            reclaimed="endpoint tokens of deleted Environments reclaimed",
        )


def _logged(change: str, tenant: str, token: EndpointTokenInfo) -> str:
    """The token's JSON answer, once its change (created, revoked) is in the log."""
    log.info(f"endpoint token {change}", extra={"tenant": tenant, "env_id": token.environment_id, "token_id": token.id})
    return token.model_dump_json(by_alias=True)
