-- ADX Environments a run's nodes created through ctx.environment(name): one row per run and name. The row (with
-- the create's idempotency key) is written before the Environment is created, and the Environment's ID is
-- recorded before the node sees the create complete, so a recovered run reattaches instead of creating another.
CREATE TABLE adx_agent_environments (
    tenant_id       text NOT NULL,
    run_id          uuid NOT NULL,
    name            text NOT NULL,
    generation      integer NOT NULL DEFAULT 1,   -- a new Environment after the previous one was deleted
    idempotency_key text NOT NULL,
    environment_id  text,                         -- NULL until the create answered (its outcome was unknown)
    status          text NOT NULL CHECK (status IN ('creating', 'active', 'paused', 'deleted')),
    keep            boolean NOT NULL,
    spec            jsonb NOT NULL,
    fence           bigint NOT NULL,              -- the fence that last wrote the row
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, run_id, name),
    FOREIGN KEY (tenant_id, run_id) REFERENCES adx_agent_runs ON DELETE CASCADE
);
