"""Mutual TLS between components over real gRPC (SEC-1): identity is the certificate."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from adx._certs import Identity, component_paths, init_ca, issue
from adx._grpc_tls import channel_credentials, require_peer, server_credentials
from adx.embedded._process import pick_free_port
from adx.proto import health_pb2, health_pb2_grpc


class WhoAmI(health_pb2_grpc.HealthServicer):
    """Answers with the caller's verified identity (nodes only)."""

    async def Check(self, request, context):
        identity = await require_peer(context, "node")
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING, detail=identity.name)


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    certs = tmp_path / "certs"
    assert init_ca(certs)
    assert not init_ca(certs)  # idempotent: an existing CA is kept
    server_paths = issue(certs, Identity("coordinator", "main"))
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(WhoAmI(), server)
    port = pick_free_port("127.0.0.1")
    server.add_secure_port(f"127.0.0.1:{port}", server_credentials(server_paths))
    await server.start()
    yield f"localhost:{port}", certs
    await server.stop(grace=None)


async def ask(target: str, credentials: grpc.ChannelCredentials) -> str:
    async with grpc.aio.secure_channel(target, credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        return response.detail


@pytest.mark.req("SEC-1")
async def test_node_identity_comes_from_its_certificate(tls_server: tuple[str, Path]) -> None:
    target, certs = tls_server
    n1 = issue(certs, Identity("node", "n1"))
    n2 = issue(certs, Identity("node", "n2"))
    assert await ask(target, channel_credentials(n1)) == "n1"
    assert await ask(target, channel_credentials(n2)) == "n2"


@pytest.mark.req("SEC-1")
async def test_wrong_kind_no_certificate_or_foreign_ca_are_refused(
    tls_server: tuple[str, Path], tmp_path: Path
) -> None:
    target, certs = tls_server
    api = issue(certs, Identity("api", "main"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await ask(target, channel_credentials(api))
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED

    ca = (certs / "ca.pem").read_bytes()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await ask(target, grpc.ssl_channel_credentials(root_certificates=ca))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE

    rogue = tmp_path / "rogue"
    init_ca(rogue)
    impostor = issue(rogue, Identity("node", "n1"))
    mixed = grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=impostor.key.read_bytes(), certificate_chain=impostor.cert.read_bytes()
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await ask(target, mixed)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_key_files_are_private(tmp_path: Path) -> None:
    init_ca(tmp_path)
    paths = issue(tmp_path, Identity("node", "n1"), ["n1.example", "10.0.0.1"])
    assert paths == component_paths(tmp_path, Identity("node", "n1"))
    assert (tmp_path / "ca.key").stat().st_mode & 0o777 == 0o600
    assert paths.key.stat().st_mode & 0o777 == 0o600


def test_identity_names_are_validated() -> None:
    assert Identity.parse("node:n-1.a") == Identity("node", "n-1.a")
    for bad in ("node", "tenant:x", "node:", "node:UPPER", "node:a b"):
        with pytest.raises(Exception, match="not an ADX identity"):
            Identity.parse(bad)
