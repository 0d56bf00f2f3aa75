-- Operations on runs: listing newest first, and operator actions (retry) with what they replaced.
CREATE INDEX adx_agent_runs_created ON adx_agent_runs (tenant_id, created_at DESC, run_id DESC);

CREATE TABLE adx_agent_run_actions (
    action_id       uuid PRIMARY KEY,
    tenant_id       text NOT NULL,
    run_id          uuid NOT NULL,
    action          text NOT NULL CHECK (action IN ('retry')),
    from_seq        bigint NOT NULL,     -- the checkpoint the run resumes from
    to_seq          bigint NOT NULL,     -- the new current checkpoint (a copy of from_seq)
    prior_status    text NOT NULL,
    prior_result    jsonb,               -- the terminal result the action replaced
    created_at      timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (tenant_id, run_id) REFERENCES adx_agent_runs ON DELETE CASCADE
);
CREATE INDEX adx_agent_run_actions_run ON adx_agent_run_actions (tenant_id, run_id, created_at);
