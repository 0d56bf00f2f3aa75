"""The Ingress: the data plane's edge. Tenant check first (SEC-4), then the owning node's Relay over mutual TLS.

Flow of a request: authenticate the tenant key, or check the endpoint token and its scope (``_tokens``) ->
resolve the Environment's route *as that tenant* (another tenant's Environment is a 404, SEC-2; nothing is woken
or forwarded) -> forward to ``https://<relay>/<environment_id>/<execd path>`` presenting the API's ``api:<name>``
certificate, streaming the request and the response bodies both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from urllib.parse import quote

from fastapi import Request
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.websockets import WebSocket

from adx._certs import Identity, client_ssl_context, component_paths
from adx._proxy_answer import ProxiedAnswer, forwarded_headers, is_short
from adx._wsproxy import Refused, UpstreamError, WebSocketClient, bridge, deny, refusal_response
from adx.errors import (
    AdxError,
    ConflictError,
    EnvironmentPausedError,
    EnvironmentPausingError,
    NotFoundError,
    UnavailableError,
    UncertainOutcomeError,
)
from adx.gateway import ApiConfig, CoordinatorClient, Route, not_found
from adx.ingress._published import Published, PublishedStates
from adx.ingress._relay_client import (
    RelayClient,
    RelayConnectError,
    RelayRequest,
    RelayResponse,
    RelayTimeoutError,
    RelayTransportError,
)
from adx.ingress._tokens import TokenCache, TokenClient, without_token_query
from adx.model import (
    DORMANT_STATES,
    ENDPOINT_TOKEN_QUERY,
    FORWARDED_HOST_HEADER,
    EnvironmentRecord,
    EnvironmentState,
)
from adx.proto import coordinator_pb2 as pb

log = logging.getLogger("adx.ingress")

#: How long a route stays cached while the Coordinator's route stream is followed (changes arrive by it).
FOLLOWED_ROUTE_SECONDS = 300.0

# Hop-by-hop headers (RFC 9110 7.6.1) are never forwarded; Authorization never leaves the Ingress: the tenant
# key must not reach a node or a sandbox.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "authorization",
        "cookie",
    }
)
_WAITABLE = frozenset({EnvironmentState.PENDING, EnvironmentState.STARTING})
#: ENV-4: business traffic to these wakes the Environment through the Coordinator's EnsureRunning (CRD-5).
_WAKEABLE = DORMANT_STATES
#: Relay answers meaning "paused or pausing here": wake it, then ask again.
_WAKE_CODES = frozenset({EnvironmentPausedError.code, EnvironmentPausingError.code})
#: Characters left as they are in the path sent to the Relay (RFC 3986 pchar and '/'; '%' keeps what the client
#: already encoded), as httpx did.
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"
#: A request body up to this size is kept so the request can be sent again after a wake-up.
REPLAYABLE_BODY_BYTES = 1 << 20


class NotRunning(ConflictError):
    code = "not_running"


class StillStarting(UnavailableError):
    code = "environment_starting"


class RelayUnavailable(UnavailableError):
    code = "relay_unavailable"


class RelayTimeout(UncertainOutcomeError):
    code = "relay_timeout"


def serving_ingress(app: Starlette) -> Ingress | None:
    """The Ingress this application serves the data plane with (``create_app`` sets it), None without one."""
    ingress = getattr(app.state, "ingress", None)
    return ingress if isinstance(ingress, Ingress) else None


def relay_ssl_context(config: ApiConfig) -> ssl.SSLContext:
    """Verify the Relay against the cluster CA and present the API server's own certificate."""
    paths = component_paths(config.certs_dir, Identity("api", config.name))
    paths.read()  # a missing file fails here, with its name, not on the first forwarded request
    return client_ssl_context(paths)


class Ingress:
    def __init__(self, coordinator: CoordinatorClient, relay: RelayClient, config: ApiConfig) -> None:
        self._coordinator = coordinator
        self._relay = relay
        self._config = config
        # (tenant, environment) -> (route, expiry): keyed by tenant, so a cached route can never answer for
        # another tenant. The route names the owner's Relay and gRPC API (CRD-1: the API's pause uses it too).
        self._routes: dict[tuple[str, str], tuple[Route, float]] = {}
        self._reconciling: asyncio.Task[None] | None = None
        # While the Coordinator's route stream is followed, cached routes are kept current by it and can
        # live long; without it they expire after route_cache_seconds.
        self.following = False
        self._follower: asyncio.Task[None] | None = None
        # SEC-4: checked endpoint tokens; revocations arrive on the route stream and drop them at once.
        self.tokens = TokenCache(
            TokenClient(coordinator, timeout=config.coordinator_timeout_seconds),
            followed_ttl=config.auth_cache_seconds,
            unfollowed_ttl=config.route_cache_seconds,
        )
        # Requests waiting for an Environment to start (``?wait=running``) are woken by its publication.
        self.published = PublishedStates()
        #: Requests whose route was not cached and was asked of the Coordinator (a primed cache saves these).
        self.route_lookups = 0

    @classmethod
    def from_config(cls, config: ApiConfig, coordinator: CoordinatorClient) -> Ingress:
        # Idle connections expire before the Relay's own keep-alive (RELAY_KEEP_ALIVE_SECONDS, 75 s) does.
        relay = RelayClient(
            relay_ssl_context(config),
            timeout=config.relay_timeout_seconds,
            connect_timeout=config.relay_connect_timeout_seconds,
            keepalive_expiry=30,
        )
        return cls(coordinator, relay, config)

    async def close(self) -> None:
        for task in (self._follower, self._reconciling):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._relay.aclose()

    def start_following(self) -> None:
        """Follow the Coordinator's route publications (CRD-1: route caches follow published routes)."""
        if self._follower is None:
            self._follower = asyncio.create_task(self._follow(), name="ingress-routes")

    async def _follow(self) -> None:
        delay = 0.2
        while True:
            try:
                async for event in self._coordinator.watch_routes():
                    delay = 0.2
                    self._apply(event)
            except AdxError as exc:
                log.warning("route stream lost: %s", exc)
            # JRN-4: cached routes keep serving through a Coordinator outage (the node's Relay re-checks its
            # local bindings); routes resolved meanwhile get the short TTL, and the resync reconciles the rest.
            self.following = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _apply(self, event: pb.RouteEvent) -> None:
        if event.revoked_token:
            self.tokens.revoked(event.revoked_token)
            return
        if event.resync:
            self.tokens.forget_all()  # revocations may have been missed while the stream was down
            self.published.forget_all()
            # Events may have been missed while the stream was down: check every cached route against the
            # Coordinator (drop the gone, update the moved) instead of dropping them all.
            self.following = True
            if self._reconciling is None or self._reconciling.done():
                self._reconciling = asyncio.create_task(self._reconcile(), name="ingress-route-reconcile")
            return
        key = (event.tenant, event.environment_id)
        self.published.published(*key, Published(event.state, event.revision))
        hit = self._routes.get(key)
        if hit is None or event.revision < hit[0].record.revision:
            return  # not cached, or older than what is cached
        if event.state == EnvironmentState.RUNNING.value and event.relay_address:
            route = hit[0]
            moved = event.node != (route.record.node or "")
            record = route.record.model_copy(update={"node": event.node or None, "revision": event.revision})
            # A moved owner's gRPC API is not in the event: the API's pause asks the Coordinator then.
            updated = Route(record, event.relay_address, "" if moved else route.node_address)
            self._routes[key] = (updated, time.monotonic() + FOLLOWED_ROUTE_SECONDS)
        else:
            self._routes.pop(key, None)

    async def _reconcile(self) -> None:
        """After a resync: every cached route is checked with the Coordinator; the gone are dropped, the
        moved updated. A Coordinator that fails meanwhile leaves the rest as they are (the next resync goes on)."""
        for key in list(self._routes):
            try:
                route = await self._coordinator.resolve_route(*key)
            except NotFoundError:
                self._routes.pop(key, None)
                continue
            except AdxError as exc:
                log.warning("route reconcile paused: %s", exc)
                return
            current = self._routes.get(key)
            if current is None or route.record.revision < current[0].record.revision:
                continue  # dropped or updated by a newer event meanwhile
            if route.record.state is EnvironmentState.RUNNING and route.relay_address:
                self._routes[key] = (route, time.monotonic() + FOLLOWED_ROUTE_SECONDS)
            else:
                self._routes.pop(key, None)

    def forget(self, tenant: str, environment_id: str) -> None:
        self._routes.pop((tenant, environment_id), None)

    async def state_published(
        self, tenant: str, environment_id: str, *, after_revision: int, leaving: frozenset[str], within: float
    ) -> bool:
        """Whether a state not in ``leaving`` was published after ``after_revision`` within ``within`` s (or the
        route stream restarted meanwhile: something may have been missed)."""
        changed = await self.published.changed(
            tenant, environment_id, after_revision=after_revision, leaving=leaving, within=within
        )
        return changed is not None

    def cached_route(self, tenant: str, environment_id: str, *, stale: bool = False) -> Route | None:
        """The cached route (``stale``: even past its expiry, for when the Coordinator cannot be asked)."""
        hit = self._routes.get((tenant, environment_id))
        if hit is None or (hit[1] <= time.monotonic() and not stale):
            return None
        return hit[0]

    async def relay_address(self, tenant: str, environment_id: str, *, fresh: bool = False) -> str:
        key = (tenant, environment_id)
        now = time.monotonic()
        hit = self._routes.get(key)
        if hit is not None and hit[1] > now and not fresh:
            return hit[0].relay_address
        self.route_lookups += 1
        deadline = now + self._config.start_wait_seconds
        delay = 0.02  # starts take ~0.1-0.3 s: look often at first, then back off
        while True:
            try:
                route = await self._coordinator.resolve_route(tenant, environment_id)
            except NotFoundError:
                self.forget(tenant, environment_id)
                raise not_found(environment_id) from None
            except UnavailableError:
                # JRN-4: the Coordinator cannot be asked: a route cached before (even past its TTL) keeps
                # serving; the owner's Relay re-checks its local binding and answers for it.
                if hit is not None and not fresh:
                    return hit[0].relay_address
                raise
            state = route.record.state
            if state is EnvironmentState.RUNNING:
                if not route.relay_address:
                    raise RelayUnavailable(f"environment {environment_id} has no reachable node right now")
                return self._remember(key, route)
            if state in _WAKEABLE:
                return await self.wake(tenant, environment_id, route.record)
            if state in _WAITABLE:
                # Wait out a start in progress instead of failing a request that would succeed in a moment.
                if time.monotonic() + delay > deadline:
                    raise StillStarting(
                        f"environment {environment_id} is still {state.value}; retry shortly",
                        details={"state": state.value},
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 1.3, 0.25)
                continue
            raise NotRunning(
                f"environment {environment_id} is {state.value}, not running", details={"state": state.value}
            )

    async def wake(self, tenant: str, environment_id: str, record: EnvironmentRecord | None = None) -> str:
        """Resume a paused Environment (CRD-5: the shared resume entry) and return its Relay; refused (NotRunning)
        for one whose ``lifecycle.wakeOnTraffic`` is false (``record``: its record, when the caller has it)."""
        await self._check_wakes_on_traffic(tenant, environment_id, record)
        started = time.monotonic()
        route = await self._coordinator.ensure_running(tenant, environment_id, self._config.wake_timeout_seconds)
        if not route.relay_address:
            raise RelayUnavailable(f"environment {environment_id} has no reachable node right now")
        log.info(
            "woke %s in %.3fs",
            environment_id,
            time.monotonic() - started,
            extra={"env_id": environment_id, "node": route.record.node},
        )
        return self._remember((tenant, environment_id), route)

    async def _check_wakes_on_traffic(self, tenant: str, environment_id: str, record: EnvironmentRecord | None) -> None:
        if record is None:
            cached = self.cached_route(tenant, environment_id, stale=True)  # the flag never changes: stale is fine
            if cached is None:
                cached = await self._coordinator.resolve_route(tenant, environment_id)
            record = cached.record
        if not record.spec.lifecycle.wake_on_traffic:
            raise NotRunning(
                f"environment {environment_id} is paused and its traffic does not wake it (lifecycle.wakeOnTraffic"
                " is false): resume it explicitly",
                details={"state": EnvironmentState.PAUSED.value, "wakeOnTraffic": False},
            )

    def remember(self, tenant: str, route: Route) -> None:
        if route.record.state is EnvironmentState.RUNNING and route.relay_address:
            self._remember((tenant, route.record.id), route)

    def _remember(self, key: tuple[str, str], route: Route) -> str:
        """Cache a resolved route: long while the route stream is followed, else for route_cache_seconds."""
        ttl = FOLLOWED_ROUTE_SECONDS if self.following else self._config.route_cache_seconds
        if ttl > 0:
            self._routes[key] = (route, time.monotonic() + ttl)
        return route.relay_address

    async def forward(
        self,
        request: Request,
        tenant: str,
        environment_id: str,
        execd_path: str,
        *,
        body: bytes | None = None,
        read_timeout: float | None,
    ) -> ProxiedAnswer:
        """Forward to the Relay; ``body`` given: sent as is, else the request body is streamed through.

        A request that meets a paused or pausing Environment wakes it and is sent again (ENV-4, IDLE-6), when
        its body can be sent again (up to REPLAYABLE_BODY_BYTES; larger streamed bodies get the Relay's answer).
        """
        if body is None:
            declared = request.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) <= REPLAYABLE_BODY_BYTES:
                body = await request.body()
        for _ in range(3):
            address = await self.relay_address(tenant, environment_id)
            upstream = await self._send(request, address, environment_id, execd_path, body, read_timeout, tenant)
            if body is None or upstream.status_code not in (409, 503):
                break
            content = await _read_whole(upstream, address)
            if _answer_code(content) not in _WAKE_CODES:
                return ProxiedAnswer(upstream.status_code, _answer_headers(upstream), whole=content)
            self.forget(tenant, environment_id)
            await self.wake(tenant, environment_id)
        if is_short(upstream.headers):  # read whole, sent in one message (docs/performance.md)
            content = await _read_whole(upstream, address)
            return ProxiedAnswer(upstream.status_code, _answer_headers(upstream), whole=content)
        return ProxiedAnswer(
            upstream.status_code,
            _answer_headers(upstream),
            chunks=upstream.aiter_raw(),
            background=BackgroundTask(upstream.aclose),
        )

    async def forward_websocket(self, websocket: WebSocket, tenant: str, environment_id: str, execd_path: str) -> None:
        """A WebSocket upgrade to the Relay's ``execd_path`` (a user port), then relayed both ways (adx._wsproxy).

        As ``forward``: a paused or pausing Environment is woken and the upgrade sent again (ENV-4, IDLE-6); the
        Relay's or the service's refusal (any HTTP answer but 101) is the client's answer, as it came. AdxError
        (not found, relay unavailable...) is raised before anything is answered."""
        headers = _relayed_headers(websocket.headers, _HOP)
        query = without_token_query(websocket.url.query)
        target = quote(f"/{environment_id}{execd_path}", safe=_PATH_SAFE) + (f"?{query}" if query else "")
        subprotocols = list(websocket.scope.get("subprotocols") or [])
        timeout = self._config.relay_timeout_seconds
        fresh = False
        for attempt in range(3):
            address = await self.relay_address(tenant, environment_id, fresh=fresh)
            try:
                reader, writer = await self._relay.open_stream(address)
            except RelayConnectError as exc:
                self.forget(tenant, environment_id)  # the owner may have moved: ask again, once
                if attempt == 0:
                    fresh = True
                    continue
                raise RelayUnavailable(f"the node's Relay at {address} cannot be reached: {exc}") from None
            try:
                opened = await WebSocketClient.open(
                    reader,
                    writer,
                    host=address,
                    target=target,
                    headers=headers,
                    subprotocols=subprotocols,
                    handshake_seconds=timeout,
                    stall_seconds=timeout,
                )
            except UpstreamError as exc:
                raise RelayTimeout(f"the WebSocket handshake with the Relay at {address} failed: {exc}") from None
            if isinstance(opened, Refused):
                if attempt < 2 and opened.status in (409, 503) and _answer_code(opened.body) in _WAKE_CODES:
                    self.forget(tenant, environment_id)
                    await self.wake(tenant, environment_id)
                    continue
                await deny(websocket, refusal_response(opened, _HOP))
                return
            await bridge(websocket, opened, [(k, v) for k, v in opened.headers if k.lower() not in _HOP])
            return

    async def _send(
        self,
        request: Request,
        address: str,
        environment_id: str,
        execd_path: str,
        body: bytes | None,
        read_timeout: float | None,
        tenant: str,
    ) -> RelayResponse:
        content: bytes | AsyncIterator[bytes] = body if body is not None else request.stream()
        # A buffered body is sent with its own Content-Length; a streamed one keeps the caller's (if any), so it
        # is not re-encoded as chunked on the way.
        drop = _HOP | {"content-length"} if body is not None else _HOP
        headers = _relayed_headers(request.headers, drop)
        query = without_token_query(request.url.query)  # an endpoint token never reaches the workload
        target = quote(f"/{environment_id}{execd_path}", safe=_PATH_SAFE) + (f"?{query}" if query else "")
        for attempt in (1, 2):
            try:
                return await self._relay.send(
                    RelayRequest(request.method, address, target, headers, content), read_timeout=read_timeout
                )
            except RelayConnectError as exc:
                # Nothing was sent (not even the body): safe to re-resolve once, the owner may have moved.
                self.forget(tenant, environment_id)
                if attempt == 1:
                    address = await self.relay_address(tenant, environment_id, fresh=True)
                    continue
                raise RelayUnavailable(f"the node's Relay at {address} cannot be reached: {exc}") from None
            except RelayTimeoutError as exc:
                raise RelayTimeout(f"the node's Relay at {address} did not answer in time: {exc}") from None
            except RelayTransportError as exc:
                raise RelayTimeout(f"the connection to the node's Relay at {address} failed: {exc}") from None
        raise AssertionError("unreachable")


def _relayed_headers(incoming: Mapping[str, str], drop: frozenset[str]) -> list[tuple[str, str]]:
    """The client's headers as sent on to the Relay: hop-by-hop and credentials dropped, and the Host the client
    asked for carried as ``X-Forwarded-Host`` (a client's own is replaced): the Relay gives it to a service in the
    sandbox as its Host, as E2B's proxy passes the sandbox host name on."""
    headers = [
        (k, v)
        for k, v in incoming.items()
        if k.lower() not in drop and k.lower() != FORWARDED_HOST_HEADER and not _carries_token(k, v)
    ]
    host = incoming.get("host")
    if host:
        headers.append((FORWARDED_HOST_HEADER, host))
    return headers


def _carries_token(name: str, value: str) -> bool:
    """A Referer of a page opened with ``?adx_token=``: the token must not reach the workload that way either."""
    return name.lower() == "referer" and ENDPOINT_TOKEN_QUERY in value


def _answer_headers(upstream: RelayResponse) -> list[tuple[bytes, bytes]]:
    """The Relay's headers as they came, hop-by-hop dropped."""
    return forwarded_headers(upstream.headers, _HOP)


async def _read_whole(upstream: RelayResponse, address: str) -> bytes:
    """The whole body of a Relay's answer (its connection returned to the pool or closed)."""
    try:
        return await upstream.aread()
    except RelayTimeoutError as exc:
        raise RelayTimeout(f"the node's Relay at {address} did not answer in time: {exc}") from None
    except RelayTransportError as exc:
        raise RelayTimeout(f"the connection to the node's Relay at {address} failed: {exc}") from None


def _answer_code(content: bytes) -> str:
    """The ``error.code`` of a Relay's JSON error answer ('' for anything else)."""
    try:
        answer = json.loads(content)
    except ValueError:
        return ""
    error = answer.get("error") if isinstance(answer, dict) else None
    return str(error.get("code", "")) if isinstance(error, dict) else ""
