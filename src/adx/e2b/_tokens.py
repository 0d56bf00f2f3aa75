"""envd access tokens: one per (tenant, sandbox), checked on every data-plane call (``X-Access-Token``).

A token is ``e2b1.<tenant, base64url>.<HMAC-SHA256(key, tenant, sandbox ID), base64url>``: it names the tenant
the call acts for and proves the API minted it for that sandbox, so the data plane needs no lookup and no
stored secret per sandbox, and the same token is handed out again by ``connect`` and ``get_info``. The key is
derived from the API server's own private key (``api-<name>.key``): API replicas that share that certificate
accept each other's tokens; a new key invalidates every token (clients reconnect to get new ones).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections import OrderedDict
from dataclasses import dataclass

from adx._certs import Identity, component_paths
from adx.e2b._connect import RpcError
from adx.gateway import ApiConfig

MAX_TOKEN = 1024
#: How many (tenant, sandbox) pairs a signed URL without a sandbox in it is checked against (KnownSandboxes).
KNOWN_SANDBOXES = 4096


class KnownSandboxes:
    """The sandboxes this API process handed a token out for or saw a valid token of, most recent last.

    A signed file URL at ``E2B_SANDBOX_URL`` names no sandbox (only ``path`` and the signature made with the
    sandbox's token); it can only be matched by trying the tokens of candidate sandboxes. Bounded, so a check
    costs at most KNOWN_SANDBOXES hashes; a sandbox falls out when KNOWN_SANDBOXES others were used since.
    """

    def __init__(self, limit: int = KNOWN_SANDBOXES) -> None:
        self._pairs: OrderedDict[str, str] = OrderedDict()  # sandbox -> tenant (IDs are never reused)
        self._limit = limit

    def remember(self, tenant: str, sandbox_id: str) -> None:
        self._pairs[sandbox_id] = tenant
        self._pairs.move_to_end(sandbox_id)
        while len(self._pairs) > self._limit:
            self._pairs.popitem(last=False)

    def recent_first(self) -> list[tuple[str, str]]:
        """(tenant, sandbox) pairs, the most recently used first."""
        return [(tenant, sandbox) for sandbox, tenant in reversed(self._pairs.items())]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class TokenForm:
    """The API's self-checking tokens, ``<prefix>.<tenant, base64url>.<MAC, base64url>``: envd access tokens
    (``e2b1``) and volume tokens (``vol1``). The tenant is in the clear; the MAC proves the API made it."""

    prefix: str

    def make(self, tenant: str, mac: bytes) -> str:
        return f"{self.prefix}.{_b64(tenant.encode())}.{_b64(mac)}"

    def read(self, token: str) -> tuple[str, bytes] | None:
        """(tenant, MAC) of a token of this form; None for anything else (too long, another prefix, not
        base64url, a tenant that is not UTF-8). The caller checks the MAC."""
        parts = token.split(".")
        if len(token) > MAX_TOKEN or len(parts) != 3 or parts[0] != self.prefix:
            return None
        try:
            return _unb64(parts[1]).decode(), _unb64(parts[2])
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None


ACCESS_TOKEN = TokenForm("e2b1")


class EnvdTokens:
    def __init__(self, key: bytes) -> None:
        self._key = hashlib.sha256(b"adx-e2b-envd-access-token\x00" + key).digest()
        self.known = KnownSandboxes()

    @classmethod
    def from_config(cls, config: ApiConfig) -> EnvdTokens:
        return cls(component_paths(config.certs_dir, Identity("api", config.name)).key.read_bytes())

    def _mac(self, tenant: str, sandbox_id: str) -> bytes:
        return hmac.new(self._key, f"{tenant}\x00{sandbox_id}".encode(), hashlib.sha256).digest()

    def proof(self, purpose: str, tenant: str, sandbox_id: str) -> bytes:
        """A MAC for another use than the access token (``purpose`` keeps the two from ever being equal)."""
        return hmac.new(self._key, f"{purpose}\x00{tenant}\x00{sandbox_id}".encode(), hashlib.sha256).digest()

    def mint(self, tenant: str, sandbox_id: str) -> str:
        """The sandbox's token, handed out to a client (so the sandbox becomes a known one)."""
        self.known.remember(tenant, sandbox_id)
        return self.token(tenant, sandbox_id)

    def token(self, tenant: str, sandbox_id: str) -> str:
        return ACCESS_TOKEN.make(tenant, self._mac(tenant, sandbox_id))

    def tenant(self, token: str | None, sandbox_id: str) -> str:
        """The tenant a valid token acts for; anything else is ``unauthenticated`` (nothing is forwarded)."""
        if not token:
            raise RpcError("unauthenticated", "missing X-Access-Token")
        read = ACCESS_TOKEN.read(token)
        if read is None or not hmac.compare_digest(read[1], self._mac(read[0], sandbox_id)):
            raise RpcError("unauthenticated", "invalid X-Access-Token")
        tenant = read[0]
        self.known.remember(tenant, sandbox_id)
        return tenant
