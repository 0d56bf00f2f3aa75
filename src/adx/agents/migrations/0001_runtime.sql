-- ADX durable agent runtime, schema version 1.
-- Every lifecycle edge of a run is one transaction over these tables; times come from now() (database time).

CREATE TABLE adx_agent_tenants (
    tenant_id   text PRIMARY KEY CHECK (tenant_id ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Durable queue order: a run's position; a yielding run takes a new value and goes to the back.
CREATE SEQUENCE adx_agent_queue_seq;

CREATE TABLE adx_agent_runs (
    tenant_id           text NOT NULL REFERENCES adx_agent_tenants,
    run_id              uuid NOT NULL,
    graph_name          text NOT NULL,
    graph_version       text NOT NULL,
    status              text NOT NULL CHECK (status IN ('queued', 'running', 'waiting', 'succeeded', 'failed', 'cancelled')),
    revision            bigint NOT NULL DEFAULT 1,
    fence               bigint NOT NULL DEFAULT 0,
    lease_owner         text,
    lease_expires_at    timestamptz,
    claim_id            uuid,
    queue_seq           bigint NOT NULL DEFAULT nextval('adx_agent_queue_seq'),
    available_at        timestamptz NOT NULL DEFAULT now(),
    wake_at             timestamptz,
    checkpoint_seq      bigint NOT NULL DEFAULT 0,
    cancel_requested_at timestamptz,
    terminal_event_id   uuid,
    descriptor          jsonb NOT NULL,
    request             jsonb NOT NULL,
    budget              jsonb NOT NULL,
    idempotency_key     text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,
    PRIMARY KEY (tenant_id, run_id),
    UNIQUE (tenant_id, idempotency_key),
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
);
-- The tenant scan walks live runs in queue order (keyset on queue_seq).
CREATE INDEX adx_agent_runs_queue ON adx_agent_runs (tenant_id, queue_seq)
    WHERE status IN ('queued', 'running', 'waiting');

CREATE TABLE adx_agent_checkpoints (
    tenant_id   text NOT NULL,
    run_id      uuid NOT NULL,
    seq         bigint NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('initial', 'node', 'wait', 'terminal')),
    next_node   text,            -- NULL: the graph reached its end; ``artifact`` holds the terminal output
    state       jsonb NOT NULL,
    artifact    jsonb,
    fence       bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, run_id, seq),
    FOREIGN KEY (tenant_id, run_id) REFERENCES adx_agent_runs ON DELETE CASCADE
);

CREATE TABLE adx_agent_events (
    event_id        uuid PRIMARY KEY,
    tenant_id       text NOT NULL,
    run_id          uuid NOT NULL,
    kind            text NOT NULL,
    schema_id       text NOT NULL,
    schema_digest   text NOT NULL,
    fence           bigint NOT NULL,
    revision        bigint NOT NULL,
    checkpoint_seq  bigint NOT NULL,
    payload         jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (tenant_id, run_id) REFERENCES adx_agent_runs ON DELETE CASCADE
);
CREATE INDEX adx_agent_events_run ON adx_agent_events (tenant_id, run_id, checkpoint_seq);

CREATE TABLE adx_agent_waits (
    tenant_id       text NOT NULL,
    run_id          uuid NOT NULL,
    wait_set        bigint NOT NULL,    -- the checkpoint seq written by the wait edge
    wait_id         text NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('interrupt', 'timer')),
    payload         jsonb,
    timer_ms        bigint,
    registered_at   timestamptz NOT NULL,
    due_at          timestamptz,
    resolved_at     timestamptz,
    resolution      jsonb,
    event_id        uuid NOT NULL REFERENCES adx_agent_events,
    PRIMARY KEY (tenant_id, run_id, wait_set, wait_id),
    FOREIGN KEY (tenant_id, run_id) REFERENCES adx_agent_runs ON DELETE CASCADE
);

CREATE TABLE adx_agent_attempts (
    attempt_id  uuid PRIMARY KEY,
    tenant_id   text NOT NULL,
    run_id      uuid NOT NULL,
    step        bigint NOT NULL,        -- the checkpoint seq the node runs from
    node        text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('node', 'model', 'tool')),
    call_key    text NOT NULL,
    fence       bigint NOT NULL,
    status      text NOT NULL CHECK (status IN ('started', 'completed', 'failed', 'abandoned', 'skipped')),
    request     jsonb,
    response    jsonb,
    usage       jsonb,
    error       text,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    FOREIGN KEY (tenant_id, run_id) REFERENCES adx_agent_runs ON DELETE CASCADE
);
CREATE INDEX adx_agent_attempts_step ON adx_agent_attempts (tenant_id, run_id, step, kind, call_key);

-- Running totals, updated in the same transaction as the attempt or node commit they count.
CREATE TABLE adx_agent_usage (
    tenant_id       text NOT NULL,
    run_id          uuid NOT NULL,
    input_tokens    bigint NOT NULL DEFAULT 0,
    output_tokens   bigint NOT NULL DEFAULT 0,
    model_calls     bigint NOT NULL DEFAULT 0,
    tool_calls      bigint NOT NULL DEFAULT 0,
    node_commits    bigint NOT NULL DEFAULT 0,
    missing_usage   bigint NOT NULL DEFAULT 0,   -- completed model calls whose provider reported no usage
    PRIMARY KEY (tenant_id, run_id),
    FOREIGN KEY (tenant_id, run_id) REFERENCES adx_agent_runs ON DELETE CASCADE
);

CREATE TABLE adx_agent_results (
    tenant_id   text NOT NULL,
    run_id      uuid NOT NULL,
    status      text NOT NULL CHECK (status IN ('succeeded', 'failed', 'cancelled')),
    result      jsonb NOT NULL,
    usage       jsonb NOT NULL,
    event_id    uuid NOT NULL,
    revision    bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, run_id),
    FOREIGN KEY (tenant_id, run_id) REFERENCES adx_agent_runs ON DELETE CASCADE
);
