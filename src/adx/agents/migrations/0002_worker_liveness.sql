-- Worker liveness: a dead worker's runs are reclaimed without waiting for their lease to expire.
-- A live worker holds a session advisory lock (key pair 1095192148, lock_key) on a dedicated connection and
-- refreshes heartbeat_at through it. Its runs become claimable before lease expiry only when BOTH its lock is
-- free (its session is gone) and its heartbeat is older than grace_ms; fencing still decides every write.
CREATE TABLE adx_agent_workers (
    identity      text PRIMARY KEY,
    tenant_id     text NOT NULL,
    lock_key      integer NOT NULL,
    grace_ms      integer NOT NULL CHECK (grace_ms > 0),
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);
