"""Sandbox host names: ``PORT-SANDBOXID.DOMAIN``, what the ``e2b`` SDK's ``get_host(port)`` (and, without
``E2B_SANDBOX_URL``, every envd and signed-file URL) is made of.

The SDK takes ``DOMAIN`` from the sandbox's ``domain`` field, which the control plane sets per sandbox to
``<proof>.<base>``: ``<base>`` is the configured ``e2b_domain`` (``api.toml``), by default ``localhost`` with
the API's port (``*.localhost`` is the loopback for curl and browsers, RFC 6761), and ``<proof>`` names the
sandbox's tenant (base32) with a MAC over (tenant, sandbox) from the API's key. So a host name routes without
any lookup, on any API replica that shares the key, and only names the API handed out reach a sandbox: a
sandbox ID with a guessed tenant, or a foreign one, is a 404. Port traffic needs nothing more (as E2B's
public sandbox URLs); envd's port (49983) still needs the access token or a signed URL.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass

from adx.e2b._tokens import EnvdTokens
from adx.errors import InvalidInputError
from adx.model import ENVIRONMENT, check_id

#: DNS labels are at most 63 characters: the tenant's base32 name is cut into labels of this size.
_CHUNK = 48
_PURPOSE = "e2b-host"
_PROOF_BYTES = 10  # 80 bits, 16 base32 characters


def _b32(data: bytes) -> str:
    return base64.b32encode(data).decode().rstrip("=").lower()


def _unb32(text: str) -> bytes:
    return base64.b32decode(text.upper() + "=" * (-len(text) % 8))


@dataclass(frozen=True)
class SandboxHost:
    port: int
    sandbox_id: str
    tenant: str


def base_domain(configured: str, request_port: int | None) -> str:
    """The configured domain, else ``localhost`` with the port the API was reached on."""
    if configured:
        return configured
    return f"localhost:{request_port}" if request_port else "localhost"


def sandbox_domain(tokens: EnvdTokens, tenant: str, sandbox_id: str, base: str) -> str:
    """The ``domain`` a sandbox is given: ``get_host(port)`` is ``{port}-{sandbox_id}.{this}``."""
    name = _b32(tenant.encode())
    labels = [name[i : i + _CHUNK] for i in range(0, len(name), _CHUNK)]
    proof = _b32(tokens.proof(_PURPOSE, tenant, sandbox_id)[:_PROOF_BYTES])
    labels[-1] += f"-{proof}"
    return ".".join([*labels, base])


def parse_host(tokens: EnvdTokens, host: str, base: str) -> SandboxHost | None:
    """The sandbox a ``Host`` header names; None when it is not a sandbox host name under ``base`` (the API
    itself); InvalidInputError when it looks like one but is malformed or its proof does not hold."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.lower().rstrip(".")
    base_name = base.rsplit(":", 1)[0].lower().rstrip(".")
    if not name.endswith("." + base_name):
        return None
    labels = name[: -len(base_name) - 1].split(".")
    first, rest = labels[0], labels[1:]
    port, _, sandbox_id = first.partition("-")
    if not port.isdigit() or not sandbox_id.startswith(f"{ENVIRONMENT}-"):
        return None  # another name under the base (e.g. api.localhost): the API itself, not a sandbox
    if not rest or not 1 <= int(port) <= 65535 or "-" not in rest[-1]:
        raise InvalidInputError("host", f"{host[:120]!r} is not PORT-SANDBOXID.DOMAIN")
    check_id("host", sandbox_id, ENVIRONMENT)
    last, _, proof = rest[-1].rpartition("-")
    try:
        tenant = _unb32("".join([*rest[:-1], last])).decode()
        given = _unb32(proof)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidInputError("host", f"{host[:120]!r} does not name a sandbox") from None
    if not hmac.compare_digest(given, tokens.proof(_PURPOSE, tenant, sandbox_id)[:_PROOF_BYTES]):
        raise InvalidInputError("host", f"{host[:120]!r} does not name a sandbox")
    return SandboxHost(int(port), sandbox_id, tenant)
