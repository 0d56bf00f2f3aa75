"""Lua scripts: every multi-key change of the Coordinator's store is one of these (atomic, compare-and-set).

Conventions: a script returns ``{status, detail}``; status 1 = done, 0 = compare failed (detail = the current
revision), negative = refused (detail = the reason). Numbers travel as strings.

Fencing (HA, ``_lease``): every script here is ``fenced(...)``: its LAST key is the leader lease and its LAST
argument the value this replica holds it under ('' = an unfenced store: tests and offline tools, never the
daemon). A script whose lease value does not match returns ``{FENCED, holder}`` before touching anything.
"""

from __future__ import annotations

FENCED = -9
#: Why a cordoned node admits nothing (the placement reads it as the node's closed admission).
CORDONED_REASON = "cordoned by an admin"

_FENCE = """
local fence = ARGV[#ARGV]
if fence ~= '' then
  local holder = redis.call('GET', KEYS[#KEYS])
  if holder ~= fence then return {-9, holder or ''} end
end
"""


def fenced(script: str) -> str:
    """``script`` refusing to run unless the caller still holds the leader lease (checked first, atomically)."""
    return _FENCE + script


# Shared fragment: would `need` fit the node's allocatable = max(limit - reserved, 0)? The limit is the capacity,
# with CPU times the node's overcommit ratio rounded down (adx.model.admission_limit: the same formula). (RES-4, RES-6)
_ADMIT = """
local function admit(node_key, now, cpu, mem, disk)
  local n = redis.call('HMGET', node_key, 'cap_cpu', 'cap_mem', 'cap_disk', 'cap_valid_until', 'admission',
                       'session_expires_at', 'res_cpu', 'res_mem', 'res_disk', 'cpu_overcommit')
  if not n[1] then return 'unknown node' end
  if n[6] == false or tonumber(n[6]) < now then return 'node session expired' end
  if n[5] ~= '1' then return 'node admission closed' end
  if tonumber(n[4]) < now then return 'node capacity sample expired' end
  local cpu_limit = math.floor(tonumber(n[1]) * (tonumber(n[10] or '1') or 1))
  local short = {}
  if cpu > 0 and cpu > math.max(cpu_limit - tonumber(n[7]), 0) then table.insert(short, 'cpu') end
  if mem > 0 and mem > math.max(tonumber(n[2]) - tonumber(n[8]), 0) then table.insert(short, 'memory') end
  if disk > 0 and disk > math.max(tonumber(n[3]) - tonumber(n[9]), 0) then table.insert(short, 'disk') end
  if #short > 0 then return 'no capacity: ' .. table.concat(short, ',') end
  return nil
end
"""

# Shared fragment: give back what ``env_id`` holds in the node's reservations (RES-4): the hash's entry goes and
# the node's reserved totals drop by its amounts. Nothing held, nothing changes.
_RELEASE = """
local function release(reservations_key, node_key, env_id)
  local held = redis.call('HGET', reservations_key, env_id)
  if not held then return end
  -- Amounts stay strings (Lua numbers are doubles and print large values as 1e+15); Redis rejects "-0".
  local cpu, mem, disk = string.match(held, '(%d+) (%d+) (%d+)')
  if cpu ~= '0' then redis.call('HINCRBY', node_key, 'res_cpu', '-' .. cpu) end
  if mem ~= '0' then redis.call('HINCRBY', node_key, 'res_mem', '-' .. mem) end
  if disk ~= '0' then redis.call('HINCRBY', node_key, 'res_disk', '-' .. disk) end
  redis.call('HDEL', reservations_key, env_id)
end
"""

# KEYS: env, tenant index, node, node reservations, idempotency key (or a dummy)
# ARGV: env_id, doc, tenant, node, generation, state, cpu, mem, disk, now, created_at, idem_ttl, route
CREATE_ENV = fenced(
    _ADMIT
    + """
if ARGV[12] ~= '0' then
  local existing = redis.call('GET', KEYS[5])
  if existing then return {2, existing} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, 'environment exists'} end
local cpu, mem, disk = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local refused = admit(KEYS[3], tonumber(ARGV[10]), cpu, mem, disk)
if refused then return {-2, refused} end
redis.call('HINCRBY', KEYS[3], 'res_cpu', ARGV[7])
redis.call('HINCRBY', KEYS[3], 'res_mem', ARGV[8])
redis.call('HINCRBY', KEYS[3], 'res_disk', ARGV[9])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[7] .. ' ' .. ARGV[8] .. ' ' .. ARGV[9])
redis.call('HSET', KEYS[1], 'doc', ARGV[2], 'rev', '1', 'gen', ARGV[5], 'tenant', ARGV[3],
           'node', ARGV[4], 'state', ARGV[6])
redis.call('ZADD', KEYS[2], ARGV[11], ARGV[1])
if ARGV[12] ~= '0' then redis.call('SET', KEYS[5], ARGV[1], 'EX', tonumber(ARGV[12])) end
redis.call('PUBLISH', 'adx:routes', ARGV[13])
return {1, '1'}
"""
)

# Shared fragment: the checkpoint catalog (CRD-9). A record references at most one checkpoint; when its
# reference changes, the new artifact is catalogued live and the old one retired (unreferenced: deletable).
_CATALOG = """
local function catalog(old_key, new_key, retired_key, old_id, new_id, new_doc, env_id, now)
  if old_id == new_id then return end
  if new_id ~= '' then
    redis.call('HSET', new_key, 'doc', new_doc, 'env', env_id, 'state', 'live')
    redis.call('SREM', retired_key, new_id)
  end
  if old_id ~= '' and redis.call('HGET', old_key, 'state') == 'live' then
    redis.call('HSET', old_key, 'state', 'retired', 'retired_at', now)
    redis.call('SADD', retired_key, old_id)
  end
end
"""

# KEYS: env, node reservations (of the record's node, or a dummy), node, tenant index,
#       old checkpoint, new checkpoint, retired checkpoints set
# ARGV: expected_rev, expected_gen ('' = any), doc, state, release ('1' releases the node reservation),
#       deleted_ttl (seconds to keep a deleted record; '0' = not deleting), env_id, route,
#       old checkpoint id ('' = none), new checkpoint id, new checkpoint doc, now
COMMIT_ENV = fenced(
    _CATALOG
    + _RELEASE
    + """
local cur = redis.call('HMGET', KEYS[1], 'rev', 'gen')
if not cur[1] then return {-1, 'not found'} end
if cur[1] ~= ARGV[1] then return {0, cur[1]} end
if ARGV[2] ~= '' and cur[2] ~= ARGV[2] then return {-3, cur[2]} end
local new_rev = tostring(tonumber(cur[1]) + 1)
redis.call('HSET', KEYS[1], 'doc', ARGV[3], 'rev', new_rev, 'state', ARGV[4])
if ARGV[5] == '1' then release(KEYS[2], KEYS[3], ARGV[7]) end
if ARGV[6] ~= '0' then
  redis.call('ZREM', KEYS[4], ARGV[7])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[6]))
end
catalog(KEYS[5], KEYS[6], KEYS[7], ARGV[9], ARGV[10], ARGV[11], ARGV[7], ARGV[12])
redis.call('PUBLISH', 'adx:routes', ARGV[8])
return {1, new_rev}
"""
)

# CRD-5: record a resume intent by compare-and-set and reserve the target node's resources in one step.
# KEYS: env, node, node reservations   ARGV: expected_rev, doc, node, generation, cpu, mem, disk, now, env_id,
#                                             route
RESUME_ENV = fenced(
    _ADMIT
    + """
local cur = redis.call('HGET', KEYS[1], 'rev')
if not cur then return {-1, 'not found'} end
if cur ~= ARGV[1] then return {0, cur} end
local cpu, mem, disk = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local refused = admit(KEYS[2], tonumber(ARGV[8]), cpu, mem, disk)
if refused then return {-2, refused} end
if not redis.call('HGET', KEYS[3], ARGV[9]) then
  redis.call('HINCRBY', KEYS[2], 'res_cpu', ARGV[5])
  redis.call('HINCRBY', KEYS[2], 'res_mem', ARGV[6])
  redis.call('HINCRBY', KEYS[2], 'res_disk', ARGV[7])
  redis.call('HSET', KEYS[3], ARGV[9], ARGV[5] .. ' ' .. ARGV[6] .. ' ' .. ARGV[7])
end
local new_rev = tostring(tonumber(cur) + 1)
redis.call('HSET', KEYS[1], 'doc', ARGV[2], 'rev', new_rev, 'state', 'resuming', 'node', ARGV[3], 'gen', ARGV[4])
redis.call('PUBLISH', 'adx:routes', ARGV[10])
return {1, new_rev}
"""
)

# CRD-9: forget a deleted artifact, only if it is still retired (nothing references it again).
# KEYS: checkpoint, retired set   ARGV: checkpoint id
FORGET_CHECKPOINT = fenced(
    """
local state = redis.call('HGET', KEYS[1], 'state')
if state == false then redis.call('SREM', KEYS[2], ARGV[1]) return {1, 'unknown'} end
if state ~= 'retired' then return {0, state} end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return {1, 'forgotten'}
"""
)

# KEYS: node, node set   ARGV: session, session_ttl, now, address, relay_address, checkpoint_capable,
#                              shared_storage, name
REGISTER_NODE = fenced(
    """
local previous = redis.call('HGET', KEYS[1], 'session')
local fresh = redis.call('EXISTS', KEYS[1]) == 0
redis.call('HSET', KEYS[1], 'session', ARGV[1], 'session_expires_at', tostring(tonumber(ARGV[3]) + tonumber(ARGV[2])),
           'address', ARGV[4], 'relay_address', ARGV[5], 'checkpoint_capable', ARGV[6], 'shared_storage', ARGV[7])
if fresh then
  redis.call('HSET', KEYS[1], 'cap_cpu', '0', 'cap_mem', '0', 'cap_disk', '0', 'cap_valid_until', '0',
             'admission', '0', 'res_cpu', '0', 'res_mem', '0', 'res_disk', '0')
end
redis.call('SADD', KEYS[2], ARGV[8])
return {1, previous or ''}
"""
)

# KEYS: node   ARGV: session, session_ttl, now
HEARTBEAT = fenced(
    """
local session = redis.call('HGET', KEYS[1], 'session')
if not session then return {-1, 'unknown node'} end
if session ~= ARGV[1] then return {-4, session} end
redis.call('HSET', KEYS[1], 'session_expires_at', tostring(tonumber(ARGV[3]) + tonumber(ARGV[2])))
return {1, ''}
"""
)

# KEYS: node   ARGV: session, cpu, mem, disk, valid_until, admission ('1'/'0'), admission_reason, devices,
#                    cpu_overcommit
# RES-4: a sample replaces capacity, its validity and the node's CPU overcommit ratio; reservations are never
# touched here.
REPORT_CAPACITY = fenced(
    f"local CORDONED_REASON = '{CORDONED_REASON}'\n"
    """
local session = redis.call('HGET', KEYS[1], 'session')
if not session then return {-1, 'unknown node'} end
if session ~= ARGV[1] then return {-4, session} end
redis.call('HSET', KEYS[1], 'cap_cpu', ARGV[2], 'cap_mem', ARGV[3], 'cap_disk', ARGV[4],
           'cap_valid_until', ARGV[5], 'node_admission', ARGV[6], 'node_admission_reason', ARGV[7], 'devices', ARGV[8],
           'cpu_overcommit', ARGV[9])
-- A cordoned node (SET_NODE_CORDONED) stays closed whatever it reports; its own view is kept for the uncordon.
if redis.call('HGET', KEYS[1], 'cordoned') == '1' then
  redis.call('HSET', KEYS[1], 'admission', '0', 'admission_reason', CORDONED_REASON)
else
  redis.call('HSET', KEYS[1], 'admission', ARGV[6], 'admission_reason', ARGV[7])
end
return {1, ''}
"""
)

# Retire a created Environment that nothing started: its node refused it for a passing reason, or its create's
# outcome was uncertain. Only a record still pending at revision 1 goes (a node's first commit moves it to 2),
# with its reservation, its tenant index entry and the idempotency key that names it, so nothing of the create
# remains and a retry with the same key creates anew.
# KEYS: env, tenant index, node, node reservations, idempotency key (or a dummy)
# ARGV: env_id, route (published so route caches drop it)
# Returns {1, ''} retired, {-1, ''} no such record, {0, rev} started (or changed) meanwhile: kept.
RETIRE_UNSTARTED_ENV = fenced(
    _RELEASE
    + """
local cur = redis.call('HMGET', KEYS[1], 'rev', 'state')
if not cur[1] then
  if redis.call('GET', KEYS[5]) == ARGV[1] then redis.call('DEL', KEYS[5]) end
  return {-1, ''}
end
if cur[1] ~= '1' or cur[2] ~= 'pending' then return {0, cur[1]} end
release(KEYS[4], KEYS[3], ARGV[1])
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('GET', KEYS[5]) == ARGV[1] then redis.call('DEL', KEYS[5]) end
redis.call('PUBLISH', 'adx:routes', ARGV[2])
return {1, ''}
"""
)

# SEC-2: a tenant and one more API key of it (only the key's hash is stored, also in the tenant's key index so
# an admin can list, revoke and rotate it).
# KEYS: tenant, tenant set, api key, tenant's key index   ARGV: created_at, name, key hash
CREATE_TENANT = fenced(
    """
redis.call('HSETNX', KEYS[1], 'created_at', ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('SET', KEYS[3], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[3], ARGV[1])
return {1, ''}
"""
)


# ---- administration (``_admin_store``) ----------------------------------------------------------------------

# One more key of an existing tenant. KEYS: tenant, api key, tenant's key index   ARGV: created_at, name, key hash
CREATE_KEY = fenced(
    """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, 'unknown tenant'} end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[3], ARGV[1])
return {1, ''}
"""
)

# Revoke one key, or rotate it (KEYS[3]/ARGV[3..4] given: the new key is stored in the same step, so there is no
# moment with neither or both). KEYS: tenant's key index, old api key[, new api key]
# ARGV: old hash, tenant[, new hash, created_at]
REVOKE_KEY = fenced(
    """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return {-1, 'unknown key'} end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
if #KEYS == 4 then
  redis.call('SET', KEYS[3], ARGV[2])
  redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
end
return {1, ''}
"""
)

# KEYS: tenant   ARGV: '1' disabled | '0' enabled
SET_TENANT_DISABLED = fenced(
    """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, 'unknown tenant'} end
redis.call('HSET', KEYS[1], 'disabled', ARGV[1])
return {1, ''}
"""
)

# KEYS: admin key, admin key index   ARGV: name, created_at, key hash
CREATE_ADMIN_KEY = fenced(
    """
redis.call('SET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[1] .. ' ' .. ARGV[2])
return {1, ''}
"""
)

# Cordon: the node's admission flag (which placement and every reservation script already honour) is held closed
# until the uncordon, which restores what the node last reported. KEYS: node   ARGV: '1' cordon | '0' uncordon
SET_NODE_CORDONED = fenced(
    f"local CORDONED_REASON = '{CORDONED_REASON}'\n"
    """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, 'unknown node'} end
if ARGV[1] == '1' then
  redis.call('HSET', KEYS[1], 'cordoned', '1', 'admission', '0', 'admission_reason', CORDONED_REASON)
else
  local own = redis.call('HMGET', KEYS[1], 'node_admission', 'node_admission_reason')
  redis.call('HDEL', KEYS[1], 'cordoned')
  redis.call('HSET', KEYS[1], 'admission', own[1] or '0', 'admission_reason', own[2] or '')
end
return {1, ''}
"""
)
