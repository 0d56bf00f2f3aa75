-- AGT-12: replica-global smooth weighted round robin across tenants. The policy row serialises every pick
-- (SELECT ... FOR UPDATE), so all workers of a policy walk ONE sequence; each pick commits with its state.
CREATE TABLE adx_agent_fair_policies (
    policy      text PRIMARY KEY CHECK (policy ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    weights     jsonb NOT NULL,          -- {"tenant": weight}; persisted once, verified at every worker start
    digest      text NOT NULL,
    seq         bigint NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE adx_agent_fair_state (
    policy      text NOT NULL REFERENCES adx_agent_fair_policies ON DELETE CASCADE,
    tenant_id   text NOT NULL,
    weight      integer NOT NULL CHECK (weight > 0),
    current     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (policy, tenant_id)
);

-- The reservations in order: which tenant each pick of the sequence went to.
CREATE TABLE adx_agent_fair_picks (
    policy      text NOT NULL REFERENCES adx_agent_fair_policies ON DELETE CASCADE,
    seq         bigint NOT NULL,
    tenant_id   text NOT NULL,
    picked_by   text NOT NULL,
    picked_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (policy, seq)
);
