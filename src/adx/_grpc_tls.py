"""gRPC credentials for mutual TLS between ADX components (SEC-1)."""

from __future__ import annotations

import grpc

from adx._certs import CertPaths, Identity, peer_identity


def server_credentials(paths: CertPaths) -> grpc.ServerCredentials:
    """Server side: present our certificate, require and verify a client certificate from the cluster CA."""
    ca, cert, key = paths.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def channel_credentials(paths: CertPaths) -> grpc.ChannelCredentials:
    """Client side: verify the server against the cluster CA and present our own certificate."""
    ca, cert, key = paths.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


async def require_peer(context: grpc.aio.ServicerContext[object, object], *kinds: str) -> Identity:
    """The verified identity of the calling component; aborts the call if it has none of ``kinds``."""
    identity = peer_identity(context.auth_context())
    if identity is None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a client certificate from the cluster CA is required")
    assert identity is not None
    if kinds and identity.kind not in kinds:
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED, f"{identity.common_name} may not call this ({' or '.join(kinds)} only)"
        )
    return identity
