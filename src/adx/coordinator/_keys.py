"""The Coordinator's Redis key layout: every key and channel its stores use (the leader lease's are
``adx.coordinator._lease``'s), so that no two stores can name one key differently or two things alike.

A keyspace is one prefix with one key per name (an Environment ID, a node, a tenant, a hash); the sets and
channels are single keys.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = [
    "ADMIN_KEYS",
    "NODE_SET",
    "RETIRED_CHECKPOINTS",
    "ROUTES_CHANNEL",
    "SNAPSHOT_CHECKPOINTS",
    "SNAPSHOT_EXPIRY",
    "TENANT_SET",
    "Keyspace",
    "admin_key_key",
    "api_key_key",
    "checkpoint_key",
    "env_key",
    "env_tokens_key",
    "idempotency_key",
    "node_key",
    "node_reservations_key",
    "snapshot_key",
    "tenant_index_key",
    "tenant_key",
    "tenant_keys_key",
    "tenant_snapshots_key",
    "token_key",
]


@dataclass(frozen=True)
class Keyspace:
    """The keys ``prefix + name``; ``keyspace("*")`` is the pattern that scans them all."""

    prefix: str

    def __call__(self, name: str) -> str:
        return self.prefix + name


#: Environment records (a hash each), and each tenant's index of its Environment IDs.
env_key = Keyspace("adx:env:")
tenant_index_key = Keyspace("adx:tenant-envs:")
#: Tenants, the set of their names, and each tenant's key index: key hash -> created_at (list, revoke, rotate).
tenant_key = Keyspace("adx:tenant:")
TENANT_SET = "adx:tenants"
tenant_keys_key = Keyspace("adx:tenant-keys:")
#: API keys and admin keys by the SHA-256 of the key (SEC-2: never the key itself); the admin keys' index.
api_key_key = Keyspace("adx:apikey:")
admin_key_key = Keyspace("adx:adminkey:")
ADMIN_KEYS = "adx:admin-keys"  # hash -> "name created_at"
#: Nodes (a hash each), their set, and each node's reservations (Environment ID -> "cpu mem disk").
node_key = Keyspace("adx:node:")
NODE_SET = "adx:nodes"
node_reservations_key = Keyspace("adx:node-res:")
#: CRD-9's checkpoint catalog: an entry per artifact, the retired ones the nodes are to delete, and the
#: artifacts snapshots hold (referenced, though no record names them).
checkpoint_key = Keyspace("adx:ckpt:")
RETIRED_CHECKPOINTS = "adx:ckpts-retired"
SNAPSHOT_CHECKPOINTS = "adx:snap-ckpts"
#: Snapshots (a hash each), each tenant's index by creation time, and the index by expiry (for the sweep).
snapshot_key = Keyspace("adx:snap:")
tenant_snapshots_key = Keyspace("adx:snaps:")
SNAPSHOT_EXPIRY = "adx:snaps-expiry"
#: Endpoint tokens by hash (SEC-4), and each Environment's index: token ID -> hash.
token_key = Keyspace("adx:etoken:")
env_tokens_key = Keyspace("adx:env-tokens:")
#: Where routes and revoked endpoint tokens are published (the Ingress follows it).
ROUTES_CHANNEL = "adx:routes"


def idempotency_key(tenant: str, key: str) -> str:
    """A create's idempotency key, per tenant; hashed, so a client's key of any length or bytes fits."""
    return f"adx:idem:{tenant}:{hashlib.sha256(key.encode()).hexdigest()}"
