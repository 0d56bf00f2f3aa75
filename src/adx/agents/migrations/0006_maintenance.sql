-- AGT-15 maintenance: run deadlines, and the maintenance role's cursors (one per tenant and task).
ALTER TABLE adx_agent_runs ADD COLUMN deadline_at timestamptz;
CREATE INDEX adx_agent_runs_deadline ON adx_agent_runs (tenant_id, deadline_at, run_id)
    WHERE deadline_at IS NOT NULL AND status IN ('queued', 'running', 'waiting') AND cancel_requested_at IS NULL;

CREATE TABLE adx_agent_maintenance_cursors (
    tenant_id   text NOT NULL,
    task        text NOT NULL,
    after_at    timestamptz,        -- keyset position in the task's order; NULL: start of a new pass
    after_id    uuid,
    passes      bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, task)
);
