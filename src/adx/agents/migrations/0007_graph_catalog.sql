-- Issue 15, authoring layer: workers publish what a submitter needs to admit a run of each graph they serve
-- (digest, entry, budget, interrupts, input and output schema documents), so a client submits by graph name
-- and version without building the executable registry. One row per (name, version, digest): a redeploy
-- with a changed graph adds a row, the newest published one is used.
CREATE TABLE adx_agent_graph_catalog (
    graph_name    text NOT NULL,
    graph_version text NOT NULL,
    graph_digest  text NOT NULL,
    descriptor    jsonb NOT NULL,
    published_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (graph_name, graph_version, graph_digest)
);
CREATE INDEX adx_agent_graph_catalog_newest ON adx_agent_graph_catalog (graph_name, graph_version, published_at DESC);
