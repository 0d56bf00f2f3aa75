-- Resolutions of declared interrupts that arrived before the run reached its wait: stored here, and consumed
-- by the wait edge that registers an interrupt of the same name (in that edge's transaction).
CREATE TABLE adx_agent_early_resolutions (
    tenant_id       text NOT NULL,
    run_id          uuid NOT NULL,
    wait_id         text NOT NULL,
    resolution      jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    consumed_at     timestamptz,
    consumed_wait_set bigint,
    FOREIGN KEY (tenant_id, run_id) REFERENCES adx_agent_runs ON DELETE CASCADE
);
-- At most one pending early resolution per interrupt name and run.
CREATE UNIQUE INDEX adx_agent_early_pending ON adx_agent_early_resolutions (tenant_id, run_id, wait_id)
    WHERE consumed_at IS NULL;
