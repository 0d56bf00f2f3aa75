-- Child runs and joins (issue 15, AGT-15). A node spawns child runs of its own tenant (ctx.spawn) and waits for
-- them with a Join wait; the maintenance role propagates cancellation to children, settles a finished parent's
-- children, publishes joins and converges failures.
ALTER TABLE adx_agent_runs ADD COLUMN parent_run_id uuid;
-- How many children the run spawned (counted in the child's admission transaction, under the parent's fence).
ALTER TABLE adx_agent_runs ADD COLUMN children integer NOT NULL DEFAULT 0;
-- Set by maintenance once a finished parent's children are all finished too (cancelled and confirmed, ...).
ALTER TABLE adx_agent_runs ADD COLUMN children_settled_at timestamptz;
ALTER TABLE adx_agent_runs ADD CONSTRAINT adx_agent_runs_parent
    FOREIGN KEY (tenant_id, parent_run_id) REFERENCES adx_agent_runs (tenant_id, run_id) ON DELETE CASCADE;
CREATE INDEX adx_agent_runs_children ON adx_agent_runs (tenant_id, parent_run_id, created_at, run_id)
    WHERE parent_run_id IS NOT NULL;
-- Maintenance: finished parents whose children are not settled yet.
CREATE INDEX adx_agent_runs_unsettled ON adx_agent_runs (tenant_id, finished_at, run_id)
    WHERE children > 0 AND children_settled_at IS NULL AND finished_at IS NOT NULL;

ALTER TABLE adx_agent_waits DROP CONSTRAINT adx_agent_waits_kind_check;
ALTER TABLE adx_agent_waits ADD CONSTRAINT adx_agent_waits_kind_check CHECK (kind IN ('interrupt', 'timer', 'join'));
-- Maintenance: join waits not published yet, in registration order.
CREATE INDEX adx_agent_waits_joins ON adx_agent_waits (tenant_id, registered_at, run_id)
    WHERE kind = 'join' AND resolved_at IS NULL;
