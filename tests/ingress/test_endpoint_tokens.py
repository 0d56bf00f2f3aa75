"""Endpoint tokens (SEC-4) on real parts: SDK/HTTP -> API server + Ingress -> Coordinator (Redis) -> the node's
adxlet and Relay -> sandboxd sandbox. A token reaches its own Environment's data plane (or one port of it) and
nothing else; revocation reaches another Ingress through the Coordinator's route stream; expiry is enforced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest
from apistack import ApiStack

import adx
from adx.coordinator._token_store import TokenStore, env_tokens_key
from adx.gateway import CoordinatorClient
from adx.proto import coordinator_pb2 as pb

#: A workload that answers every GET with what reached it: its path and query, and any Cookie or Authorization
#: or Referer header (the Ingress must forward none of the token's carriers).
ECHO = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("path=" + self.path + " cookie=" + self.headers.get("Cookie", "")
                + " auth=" + self.headers.get("Authorization", "")
                + " referer=" + self.headers.get("Referer", "")).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
"""


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def until(
    send: Callable[[], Awaitable[httpx.Response]], done: Callable[[httpx.Response], bool], within: float
) -> httpx.Response:
    """The first answer that is ``done``, or the last one after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        answer = await send()
        if done(answer) or time.monotonic() > deadline:
            return answer
        await asyncio.sleep(0.02)


def error(answer: httpx.Response) -> tuple[int, str, str]:
    body = answer.json()["error"]
    return answer.status_code, body["code"], body["message"]


@pytest.mark.req("SEC-4", "SEC-2")
async def test_a_token_reaches_its_environment_data_plane_and_nothing_else(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key, other_key = await stack.tenant("alpha"), await stack.tenant("beta")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)
        sibling = await client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)
        await sibling.files.write("/work/kept.txt", b"kept")
        await sibling.pause()
        token = await env.tokens.create()
        assert token.token.startswith("adxt_") and token.id.startswith("tok_") and token.port is None
        assert token.expires_at is None and token.environment_id == env.id
        async with stack.http(None) as http, stack.http(token.token) as holder:
            # The whole data plane of its Environment: commands and files.
            ran = await holder.post(f"/v1/environments/{env.id}/commands", json={"command": "echo via-token"})
            assert ran.status_code == 200 and "via-token" in ran.text
            wrote = await holder.put(f"/v1/environments/{env.id}/files", params={"path": "/work/t.txt"}, content=b"t")
            assert wrote.status_code < 300, wrote.text
            assert (await env.files.read("/work/t.txt")) == b"t"
            # Another Environment of the same tenant: refused before any lookup, so the paused one stays asleep.
            code, kind, message = error(
                await holder.post(f"/v1/environments/{sibling.id}/commands", json={"command": "true"})
            )
            assert (code, kind) == (403, "forbidden") and "only its own Environment" in message
            assert (await client.environments.get(sibling.id)).state == "paused"
            # The control plane: every route refuses it, saying why (not "unknown API key").
            for method, path in [
                ("GET", f"/v1/environments/{env.id}"),
                ("GET", "/v1/environments"),
                ("DELETE", f"/v1/environments/{env.id}"),
                ("POST", f"/v1/environments/{env.id}/pause"),
                ("POST", f"/v1/environments/{env.id}/tokens"),
                ("GET", f"/v1/environments/{env.id}/tokens"),
            ]:
                code, kind, message = error(await holder.request(method, path))
                assert (code, kind) == (403, "forbidden"), (method, path)
                assert "endpoint token reaches only its Environment's data plane" in message
            assert (await client.environments.get(env.id)).state == "running"
            # Not a token at all / a made-up one: 401.
            bogus = await http.post(
                f"/v1/environments/{env.id}/commands", json={"command": "true"}, headers=bearer("adxt_" + "x" * 43)
            )
            assert error(bogus)[:2] == (401, "unauthenticated")
            # Another tenant's key still learns nothing of the Environment; the tenant's own key still works.
            async with stack.http(other_key) as other:
                assert (await other.get(f"/v1/environments/{env.id}/tokens")).status_code == 404
            assert (await env.commands.run("echo still")).stdout.strip() == "still"
        # The tenant manages its tokens: list shows no secret, bad input names its field.
        listed = await env.tokens.list()
        assert [t.id for t in listed] == [token.id] and not hasattr(listed[0], "token")
        async with stack.http(key) as owner:
            for body, field in [
                ({"port": 0}, "port"),
                ({"port": "8000"}, "port"),
                ({"ttlSeconds": -1}, "ttlSeconds"),
                ({"ttlSeconds": True}, "ttlSeconds"),
                ({"x": 1}, "x"),
            ]:
                bad = await owner.post(f"/v1/environments/{env.id}/tokens", json=body)
                assert bad.status_code == 422 and bad.json()["error"]["details"]["field"] == field, bad.text
            assert (await owner.delete(f"/v1/environments/{env.id}/tokens/nope")).status_code == 422
            assert (await owner.delete(f"/v1/environments/{env.id}/tokens/tok_000000000000")).status_code == 404
            missing = await owner.post("/v1/environments/env-aaaaaaaaaaaaaaaaaaaaaaaaaa/tokens", json={})
            assert missing.status_code == 404
        await sibling.delete()
        await env.delete()
        deadline = time.monotonic() + 20
        while (await client.environments.get(env.id)).state != "deleted":
            assert time.monotonic() < deadline, "the Environment was not deleted in time"
            await asyncio.sleep(0.05)
    # A deleted Environment's tokens are reclaimed by the Coordinator's sweep (every minute; run at once here), and
    # revoked on the route stream like any other: the Ingress that cached this one refuses it.
    async with stack.http(token.token) as holder:
        before = await holder.post(f"/v1/environments/{env.id}/commands", json={"command": "true"})
        assert error(before)[:2] == (409, "not_running")  # as for anyone, until the sweep
        store = nc.cluster.coordinator.store
        assert await TokenStore(store).sweep() == 1
        assert not await store._redis.exists(env_tokens_key(env.id))
        answer = await until(
            lambda: holder.post(f"/v1/environments/{env.id}/commands", json={"command": "true"}),
            lambda a: a.status_code == 401,
            within=5,
        )
        assert error(answer)[:2] == (401, "unauthenticated")


@pytest.mark.req("SEC-4")
async def test_a_port_scoped_token_reaches_that_port_only_by_header_query_or_cookie(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(
            cpu=0.25, memory="256Mi", entrypoint=["python3", "-c", ECHO], wait_timeout=30
        )
        token = await env.tokens.create(port=8000)
        port_url = f"/v1/environments/{env.id}/ports/8000/page"
        async with stack.http(None) as http:
            # The workload may still be binding its port (502 until then).
            served = await until(
                lambda: http.get(port_url, headers=bearer(token.token), params={"q": "1"}),
                lambda a: a.status_code != 502,
                within=20,
            )
            assert served.status_code == 200, served.text
            # The workload sees its own query, and neither the token nor the tenant's credentials.
            assert served.text == "path=/page?q=1 cookie= auth= referer="
            # Other ports and the rest of the data plane: 403 naming the port it does reach.
            other_port = await http.get(f"/v1/environments/{env.id}/ports/8001/", headers=bearer(token.token))
            code, kind, message = error(other_port)
            assert (code, kind) == (403, "forbidden") and "only port 8000" in message
            commands = await http.post(
                f"/v1/environments/{env.id}/commands", json={"command": "true"}, headers=bearer(token.token)
            )
            assert error(commands)[:2] == (403, "forbidden")
            files = await http.get(
                f"/v1/environments/{env.id}/files", params={"path": "/etc/hostname"}, headers=bearer(token.token)
            )
            assert error(files)[:2] == (403, "forbidden")

        # A browser: the link carries the token in the query; the answer sets a cookie scoped to the port's path.
        link = env.tokens.url(token, "/page")
        assert link.startswith(f"{stack.url}/v1/environments/{env.id}/ports/8000/page?adx_token=")
        async with httpx.AsyncClient(timeout=10) as browser:
            first = await browser.get(link)
            assert first.status_code == 200 and first.text == "path=/page cookie= auth= referer=", first.text
            cookie = first.headers["set-cookie"]
            assert cookie.startswith(f"adx_token={token.token};")
            assert f"Path=/v1/environments/{env.id}/ports/8000/" in cookie and "HttpOnly" in cookie
            assert first.headers["referrer-policy"] == "no-referrer"
            # The page's next request carries only the cookie (which the workload does not see either).
            again = await browser.get(
                f"{stack.url}/v1/environments/{env.id}/ports/8000/next?a=b", headers={"Referer": link}
            )
            assert again.status_code == 200 and again.text == "path=/next?a=b cookie= auth= referer=", again.text
            assert "set-cookie" not in again.headers
        # The cookie alone does not open another port: the scope is checked at the Ingress, not by the path.
        async with stack.http(None) as http:
            forged = await http.get(
                f"/v1/environments/{env.id}/ports/8001/", headers={"Cookie": f"adx_token={token.token}"}
            )
            assert error(forged)[:2] == (403, "forbidden")
            # With the tenant's key in the header, a stray token cookie is not what counts.
            owner = await http.get(
                f"/v1/environments/{env.id}/ports/8000/x",
                headers={"Cookie": "adx_token=adxt_garbage", "Referer": "http://example/a", **bearer(key)},
            )
            assert owner.status_code == 200 and owner.text == "path=/x cookie= auth= referer=http://example/a"
        await env.delete()


@pytest.mark.req("SEC-4")
async def test_revoking_a_token_reaches_another_ingress_through_the_route_stream(node_cluster, api_for) -> None:
    nc = await node_cluster()
    first: ApiStack = await api_for(nc.cluster)
    # A second, independent API server + Ingress; it caches checked tokens for 5 minutes, so only the
    # revocation pushed through the Coordinator's route stream can make it refuse the token in time.
    second: ApiStack = await api_for(nc.cluster, auth_cache_seconds=300)
    key = await first.tenant("alpha")
    async with adx.AsyncClient(api_url=first.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)
        token = await env.tokens.create()
        async with second.http(token.token) as holder:
            deadline = time.monotonic() + 10
            while not second.server.config.app.state.ingress.following:  # type: ignore[attr-defined]
                assert time.monotonic() < deadline, "the second Ingress never followed the route stream"
                await asyncio.sleep(0.05)
            url = f"/v1/environments/{env.id}/commands"
            for _ in range(3):
                ran = await holder.post(url, json={"command": "echo ok"})
                assert ran.status_code == 200 and "ok" in ran.text
            tokens = second.server.config.app.state.ingress.tokens  # type: ignore[attr-defined]
            assert tokens.lookups == 1  # checked once, then served from its cache
            await env.tokens.revoke(token)
            answer = await until(
                lambda: holder.post(url, json={"command": "echo ok"}), lambda a: a.status_code != 200, within=5
            )
            assert answer.status_code != 200, "the revocation did not reach the second Ingress in 5 s"
            assert error(answer)[:2] == (401, "unauthenticated")
            assert "revoked" in error(answer)[2]
        assert await env.tokens.list() == []
        # The revoking API server's own Ingress refuses it at once.
        async with first.http(token.token) as holder:
            assert (await holder.post(url, json={"command": "true"})).status_code == 401
        await env.delete()


@pytest.mark.req("SEC-4")
async def test_an_expired_token_or_a_disabled_tenants_token_is_refused(node_cluster, api_for) -> None:
    nc = await node_cluster()
    stack: ApiStack = await api_for(nc.cluster)
    key = await stack.tenant("alpha")
    async with adx.AsyncClient(api_url=stack.url, api_key=key) as client:
        env = await client.environments.create(cpu=0.25, memory="256Mi", wait_timeout=30)
        token = await env.tokens.create(ttl=3)
        lasting = await env.tokens.create(ttl=3600)
        assert token.expires_at is not None and token.expires_at - token.created_at == pytest.approx(3)
        assert {t.id for t in await env.tokens.list()} == {token.id, lasting.id}
        url = f"/v1/environments/{env.id}/commands"
        async with stack.http(token.token) as holder:
            assert (await holder.post(url, json={"command": "true"})).status_code == 200  # cached from now on
            await asyncio.sleep(max(0.0, token.expires_at - time.time()) + 0.2)
            code, kind, message = error(await holder.post(url, json={"command": "true"}))
            assert (code, kind) == (401, "unauthenticated") and f"endpoint token {token.id} expired at" in message
        assert [t.id for t in await env.tokens.list()] == [lasting.id]
        async with stack.http(lasting.token) as holder:
            assert (await holder.post(url, json={"command": "true"})).status_code == 200
        unused = await env.tokens.create()
        await env.delete()
    # A disabled tenant's tokens are refused too (checked with the token, before anything else).
    coordinator = CoordinatorClient.from_config(stack.config)
    try:
        await coordinator.admin.SetTenantDisabled(pb.SetTenantDisabledRequest(name="alpha", disabled=True), timeout=10)
    finally:
        await coordinator.close()
    async with stack.http(unused.token) as holder:
        code, kind, message = error(await holder.post(url, json={"command": "true"}))
        assert (code, kind) == (401, "unauthenticated") and "its tenant alpha is disabled" in message
