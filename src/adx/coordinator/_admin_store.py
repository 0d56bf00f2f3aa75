"""The administration part of the Coordinator's store: admin keys, tenants' keys and disabled flags, node cordons.

Only hashes of keys are stored (SEC-2). A key is named by its ID, ``key_`` and the first 12 hex digits of its
hash: enough to tell a tenant's keys apart, useless to guess the key. Every change is one fenced Lua script.
"""

from __future__ import annotations

import time

from redis.commands.core import AsyncScript

from adx.coordinator import _scripts
from adx.coordinator._keys import (
    ADMIN_KEYS,
    TENANT_SET,
    admin_key_key,
    api_key_key,
    node_key,
    tenant_key,
    tenant_keys_key,
)
from adx.coordinator._redis_store import _text
from adx.coordinator._store import CoordinatorStore, hash_api_key, new_api_key
from adx.errors import ConflictError, InvalidInputError, NotFoundError
from adx.model import ADMIN_KEY_PREFIX, TENANT_KEY_PREFIX, AdminIdentity, IssuedKey, KeyInfo, TenantInfo

KEY_ID_PREFIX = "key_"
KEY_ID_DIGITS = 12


def key_id(digest: str) -> str:
    return KEY_ID_PREFIX + digest[:KEY_ID_DIGITS]


def check_name(field: str, name: str) -> str:
    if not name or len(name) > 64 or not all(c.isascii() and (c.isalnum() or c in "-_") for c in name):
        raise InvalidInputError(field, "must be 1-64 letters, digits, '-' or '_'")
    return name


class AdminStore:
    def __init__(self, store: CoordinatorStore) -> None:
        self._store = store
        redis = store._redis
        self._redis = redis
        self._create_key = redis.register_script(_scripts.CREATE_KEY)
        self._revoke_key = redis.register_script(_scripts.REVOKE_KEY)
        self._set_disabled = redis.register_script(_scripts.SET_TENANT_DISABLED)
        self._create_admin_key = redis.register_script(_scripts.CREATE_ADMIN_KEY)
        self._set_cordoned = redis.register_script(_scripts.SET_NODE_CORDONED)

    # -- admin keys ---------------------------------------------------------------------------------
    async def create_admin_key(self, name: str) -> IssuedKey:
        check_name("name", name)
        api_key, digest = new_api_key(ADMIN_KEY_PREFIX)
        await self._store._script(
            "create admin key",
            self._create_admin_key,
            [admin_key_key(digest), ADMIN_KEYS],
            [name, repr(time.time()), digest],
        )
        return IssuedKey(owner=name, key_id=key_id(digest), api_key=api_key)

    async def authenticate_admin(self, api_key: str) -> AdminIdentity:
        digest = hash_api_key(api_key)
        name = await self._store._call(
            "authenticate admin", lambda: self._redis.get(admin_key_key(digest)), writes=False
        )
        if name is None:
            raise NotFoundError("unknown admin key")
        return AdminIdentity(name=_text(name), key_id=key_id(digest))

    # -- tenants ------------------------------------------------------------------------------------
    async def tenant(self, name: str) -> TenantInfo:
        async def read() -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hgetall(tenant_key(name))
                pipe.hgetall(tenant_keys_key(name))
                head, keys = await pipe.execute()
            return head, keys

        head, keys = await self._store._call("get tenant", read, writes=False)
        if not head:
            raise NotFoundError(f"tenant {name} not found (`adx tenant list` shows the tenants)")
        fields = {_text(k): _text(v) for k, v in head.items()}
        return TenantInfo(
            name=name,
            created_at=float(fields.get("created_at", 0)),
            disabled=fields.get("disabled") == "1",
            keys=sorted(
                (KeyInfo(id=key_id(_text(d)), created_at=float(_text(at))) for d, at in keys.items()),
                key=lambda k: (k.created_at, k.id),
            ),
        )

    async def tenant_disabled(self, name: str) -> bool:
        flag = await self._store._call(
            "tenant flag", lambda: self._redis.hget(tenant_key(name), "disabled"), writes=False
        )
        return flag is not None and _text(flag) == "1"

    async def list_tenants(self) -> list[TenantInfo]:
        names = await self._store._call("list tenants", lambda: self._redis.smembers(TENANT_SET), writes=False)
        out = []
        for raw in sorted(_text(n) for n in names):
            try:
                out.append(await self.tenant(raw))
            except NotFoundError:
                continue
        return out

    async def create_tenant(self, name: str) -> IssuedKey:
        """A new tenant and its first key; an existing name is refused (add keys with ``create_key``)."""
        check_name("name", name)
        exists = await self._store._call("tenant exists", lambda: self._redis.exists(tenant_key(name)), writes=False)
        if exists:
            raise ConflictError(f"tenant {name} exists; add a key to it with `adx key create {name}`")
        api_key = await self._store.create_tenant(name)
        return IssuedKey(owner=name, key_id=key_id(hash_api_key(api_key)), api_key=api_key)

    async def set_disabled(self, name: str, disabled: bool) -> TenantInfo:
        what = "disable tenant" if disabled else "enable tenant"
        await self._set_flag(what, self._set_disabled, tenant_key(name), disabled, f"tenant {name} not found")
        return await self.tenant(name)

    async def create_key(self, tenant: str) -> IssuedKey:
        api_key, digest = new_api_key(TENANT_KEY_PREFIX)
        status, _ = await self._store._script(
            "create key",
            self._create_key,
            [tenant_key(tenant), api_key_key(digest), tenant_keys_key(tenant)],
            [repr(time.time()), tenant, digest],
        )
        if status == -1:
            raise NotFoundError(f"tenant {tenant} not found (create it with `adx tenant create {tenant}`)")
        return IssuedKey(owner=tenant, key_id=key_id(digest), api_key=api_key)

    async def _digest_of(self, tenant: str, kid: str) -> str:
        if not kid.startswith(KEY_ID_PREFIX) or len(kid) != len(KEY_ID_PREFIX) + KEY_ID_DIGITS:
            raise InvalidInputError(
                "keyId", f"must look like {KEY_ID_PREFIX}0123456789ab (`adx tenant list` shows them)"
            )
        digests = await self._store._call(
            "tenant keys", lambda: self._redis.hkeys(tenant_keys_key(tenant)), writes=False
        )
        for raw in digests:
            digest = _text(raw)
            if key_id(digest) == kid:
                return digest
        raise NotFoundError(f"tenant {tenant} has no key {kid} (revoked already, or another tenant's)")

    async def revoke_key(self, tenant: str, kid: str) -> TenantInfo:
        digest = await self._digest_of(tenant, kid)
        status, _ = await self._store._script(
            "revoke key", self._revoke_key, [tenant_keys_key(tenant), api_key_key(digest)], [digest, tenant]
        )
        if status == -1:
            raise NotFoundError(f"tenant {tenant} has no key {kid} (revoked meanwhile)")
        return await self.tenant(tenant)

    async def rotate_key(self, tenant: str, kid: str) -> IssuedKey:
        """A new key replacing ``kid`` in one step: the old one is refused from then on."""
        digest = await self._digest_of(tenant, kid)
        api_key, new = new_api_key(TENANT_KEY_PREFIX)
        status, _ = await self._store._script(
            "rotate key",
            self._revoke_key,
            [tenant_keys_key(tenant), api_key_key(digest), api_key_key(new)],
            [digest, tenant, new, repr(time.time())],
        )
        if status == -1:
            raise NotFoundError(f"tenant {tenant} has no key {kid} (revoked meanwhile)")
        return IssuedKey(owner=tenant, key_id=key_id(new), api_key=api_key)

    # -- nodes --------------------------------------------------------------------------------------
    async def set_cordoned(self, node: str, cordoned: bool) -> None:
        what = "cordon node" if cordoned else "uncordon node"
        missing = f"node {node} not found (`adx node list` shows the nodes)"
        await self._set_flag(what, self._set_cordoned, node_key(node), cordoned, missing)

    async def _set_flag(self, what: str, script: AsyncScript, key: str, on: bool, missing: str) -> None:
        """An admin's on/off flag on ``key`` (a tenant's disabled, a node's cordon); NotFoundError(``missing``)
        when there is no such tenant or node."""
        status, _ = await self._store._script(what, script, [key], ["1" if on else "0"])
        if status == -1:
            raise NotFoundError(missing)
