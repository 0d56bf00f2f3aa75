"""The authoring layer (issue 15): graphs from decorated functions or a LangGraph-like builder, pydantic or
dict state, the standard schemas registered for you, and a Client that submits by graph name and version
from the catalog workers publish - on real PostgreSQL, driven by the real scheduler."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from agents_helpers import TENANT, fetch, make_scheduler
from pydantic import BaseModel

from adx.agents import (
    END,
    START,
    AgentRuns,
    AgentStore,
    App,
    Client,
    DurableGraphDriverOptions,
    DurableTenantSchedulerOptions,
    ExecutableGraphRegistry,
    Fail,
    Goto,
    Interrupt,
    ResolveOutcome,
    RunStatus,
    SchemaValidationError,
    ToolCall,
    resolution,
)
from adx.agents._authoring import registrations
from adx.agents._catalog import publish_graphs
from adx.agents._deploy import build_executables
from adx.agents._loading import load_application
from adx.errors import ConflictError, InvalidInputError, NotFoundError

REPO = Path(__file__).resolve().parents[2]


class Ticket(BaseModel):
    text: str
    priority: int = 0
    category: str | None = None
    approved_by: str | None = None
    reply: str | None = None


def support_app(replies: list[str]) -> App:
    app = App("support", version=1)

    @app.tool
    async def send_reply(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
        replies.append(f"{call.idempotency_key}:{args['text']}")
        return {"sent": args["text"].upper()}

    @app.node
    async def classify(state: Ticket) -> Ticket | Goto:
        if "spam" in state.text:
            return Goto(END, {"category": "spam"})
        return state.model_copy(update={"category": "billing"})

    @app.node(interrupts=["approve"])
    async def approve(ctx: Any, state: Ticket) -> dict[str, Any] | Interrupt:
        decision = resolution(ctx, "approve")
        if decision is None:
            return Interrupt("approve", {"text": state.text})
        return {"approved_by": decision["by"]}

    @app.node
    async def reply(ctx: Any, state: Ticket) -> dict[str, Any]:
        sent = await ctx.tool("send_reply", {"text": state.text})
        return {"reply": sent["sent"]}

    return app


def registry_of(*apps: App) -> ExecutableGraphRegistry:
    return build_executables(registrations(apps))


async def drive(store: AgentStore, registry: ExecutableGraphRegistry, client: Client, run_id: uuid.UUID) -> RunStatus:
    """Tick the real scheduler until the run waits (unresolved) or finished."""
    scheduler = make_scheduler(store, registry)
    for _ in range(50):
        await scheduler.tick()
        view = await client.get(run_id)
        if view.finished or (view.status is RunStatus.WAITING and not any(w.resolved for w in view.waits)):
            return view.status
    raise AssertionError(f"run {run_id} did not settle: {view}")


@pytest.mark.req("AGT-1", "AGT-2", "AGT-5")
async def test_decorated_graph_with_model_state_goto_approval_and_tool(store: AgentStore) -> None:
    replies: list[str] = []
    app = support_app(replies)
    registry = registry_of(app)
    # The standard audit schemas came for free, and the graph's contracts from the model.
    assert {"urn:adx-app:support/1/input", "urn:adx-app:support/1/output"} <= set(registry.schemas.ids())
    assert any(sid.startswith("https://stknot.com/schemas/runtime/") for sid in registry.schemas.ids())
    assert registry.get("support", "1").interrupts == ("approve",)
    await publish_graphs(store, registry)
    client = Client(store, TENANT)

    run = await client.submit("support", Ticket(text="refund me", priority=2), version=1)
    assert await drive(store, registry, client, run.run_id) is RunStatus.WAITING
    assert [w.wait_id for w in (await client.get(run)).waits] == ["approve"]
    assert await client.resolve(run, "approve", {"by": "ann"}) is ResolveOutcome.RESOLVED
    assert await drive(store, registry, client, run.run_id) is RunStatus.SUCCEEDED
    done = await client.wait(run, output=Ticket, timeout=10)
    assert done.ok and isinstance(done.output, Ticket)
    assert done.output == Ticket(text="refund me", priority=2, category="billing", approved_by="ann", reply="REFUND ME")
    assert replies == [f"{run.run_id}/3/reply/send_reply#0:refund me"]

    # Approved before the run reaches its wait (the interrupt is declared): stored and used there.
    early = await client.submit(app, {"text": "early bird"})
    assert await client.resolve(early, "approve", {"by": "bob"}) is ResolveOutcome.STORED_EARLY
    assert await drive(store, registry, client, early.run_id) is RunStatus.SUCCEEDED
    assert (await client.wait(early, output=Ticket)).output.approved_by == "bob"  # type: ignore[union-attr]

    # Goto(END) from the first node skips the rest; the output is still a Ticket.
    spam = await client.submit("support", {"text": "buy spam"}, version="1")
    assert await drive(store, registry, client, spam.run_id) is RunStatus.SUCCEEDED
    out = (await client.wait(spam, output=Ticket)).output
    assert out is not None and out.category == "spam" and out.reply is None
    nodes = [e.payload.get("node") for e in await client.runs.history(TENANT, spam.run_id) if e.payload.get("node")]
    assert nodes == ["classify"]


async def test_langgraph_like_builder_with_dict_state_and_conditional_edges(store: AgentStore) -> None:
    app = App("router", version="2024-1")

    async def start(state: dict[str, Any]) -> dict[str, Any]:
        return {"n": state["n"] + 1}

    async def small(state: dict[str, Any]) -> dict[str, Any]:
        return {"size": "small"}

    async def large(ctx: Any, state: dict[str, Any]) -> dict[str, Any] | Fail:
        if state["n"] > 100:
            return Fail("too large")
        return {"size": "large", "run": str(ctx.run_id)}

    app.add_node("large", large)  # declared first: the entry is set explicitly below
    app.add_node("small", small)
    app.add_node("start", start)
    app.add_edge(START, "start")
    app.add_conditional_edges(
        "start", lambda s: "big" if s["n"] > 10 else "little", {"big": "large", "little": "small"}
    )
    app.add_edge("small", END)
    app.add_edge("large", END)
    registry = registry_of(app)
    assert registry.get("router", "2024-1").entry == "start"
    await publish_graphs(store, registry)
    client = Client(store, TENANT)

    runs = [await client.submit("router", {"n": n}) for n in (1, 50, 500)]  # newest published version
    for run in runs:
        await drive(store, registry, client, run.run_id)
    small_done, large_done, failed = [await client.wait(r, timeout=10) for r in runs]
    assert small_done.output == {"n": 2, "size": "small"}
    assert large_done.output == {"n": 51, "size": "large", "run": str(runs[1].run_id)}
    assert failed.status is RunStatus.FAILED and "too large" in str(failed.failure)


@pytest.mark.req("AGT-16")
async def test_client_needs_only_the_catalog_and_names_what_is_wrong(store: AgentStore) -> None:
    client = Client(store, TENANT)
    with pytest.raises(NotFoundError, match="not published in this database: start a worker"):
        await client.submit("support", {"text": "x"}, version=1)
    v1 = support_app([])
    await publish_graphs(store, registry_of(v1))
    with pytest.raises(NotFoundError, match="'support' version '7'"):
        await client.submit("support", {"text": "x"}, version=7)
    with pytest.raises(SchemaValidationError, match="text"):  # the published input schema (from Ticket)
        await client.submit("support", {"priority": 1}, version=1)
    with pytest.raises(SchemaValidationError, match="priority"):
        await client.submit("support", {"text": "x", "priority": "high"}, version=1)

    # A second version published later is the default; the first stays submittable by number.
    v2 = App("support", version=2)

    @v2.node
    async def only(state: dict[str, Any]) -> dict[str, Any]:
        return {"v": 2}

    await publish_graphs(store, registry_of(v2))
    assert (await client.submit("support", {"text": "x"})).graph_version == "2"
    assert (await client.submit("support", {"text": "x"}, version=1)).graph_version == "1"

    # The admitted descriptor carries the worker's digests: a worker with the same App drives it.
    row = (await fetch(store, "SELECT descriptor FROM adx_agent_runs WHERE graph_version = '1'"))[0]
    assert row["descriptor"]["graph_digest"] == registry_of(support_app([])).get("support", "1").digest


def test_authoring_errors_name_the_field() -> None:
    app = App("bad", version=1)
    with pytest.raises(InvalidInputError, match=r"nodes\.sync"):

        @app.node
        def sync(state: dict[str, Any]) -> dict[str, Any]:  # not async
            return state

    with pytest.raises(InvalidInputError, match="has no nodes"):
        registry_of(app)

    @app.node(next="nowhere")
    async def first(state: dict[str, Any]) -> None:
        return None

    with pytest.raises(InvalidInputError, match="nowhere"):
        registry_of(app)
    with pytest.raises(ConflictError, match="already has a node 'first'"):
        app.add_node("first", first)
    with pytest.raises(InvalidInputError, match="version"):
        App("x", version=True)
    with pytest.raises(InvalidInputError, match="'my app' is not a graph name"):
        App("my app")


async def test_a_node_returning_the_wrong_type_fails_the_run_naming_the_node(store: AgentStore) -> None:
    app = App("oops", version=1)

    @app.node
    async def broken(state: dict[str, Any]) -> Any:
        return 42

    registry = registry_of(app)
    await publish_graphs(store, registry)
    client = Client(store, TENANT)
    run = await client.submit("oops", {})
    options = DurableGraphDriverOptions(lease_seconds=5.0, retry_backoff_seconds=0.01, max_node_attempts=2)
    scheduler = make_scheduler(store, registry, driver=options)
    for _ in range(200):
        if (await client.get(run)).finished:
            break
        await scheduler.tick()
        await asyncio.sleep(0.01)
    done = await client.wait(run, timeout=10)
    assert done.status is RunStatus.FAILED
    assert "nodes.broken" in str(done.failure) and "not int" in str(done.failure)


def test_loading_names_the_module_the_path_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(InvalidInputError) as missing:
        load_application("no_such_app_mod")
    text = str(missing.value)
    assert "no module named 'no_such_app_mod'" in text and "sys.path" in text and str(tmp_path) in text
    assert "Run from the directory that holds no_such_app_mod.py" in text

    (tmp_path / "needs_dep.py").write_text("import not_installed_pkg_xyz\n")
    with pytest.raises(InvalidInputError, match="imports 'not_installed_pkg_xyz', which is not installed"):
        load_application("needs_dep")
    (tmp_path / "raises_mod.py").write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(InvalidInputError, match="RuntimeError: boom at import"):
        load_application("raises_mod")

    (tmp_path / "two_apps.py").write_text(
        "from adx.agents import App\na = App('a')\nb = App('b')\n\n@a.node\nasync def n(s):\n    return s\n"
    )
    module = load_application("two_apps")  # the current directory is importable, no PYTHONPATH
    assert [app.name for app in module.apps] == ["a", "b"]
    assert [app.name for app in load_application("two_apps:a").apps] == ["a"]
    with pytest.raises(InvalidInputError, match=r"no adx.agents.App named 'c' \(it has \['a', 'b'\]\)"):
        load_application("two_apps:c")
    elsewhere = tmp_path / "sub"
    elsewhere.mkdir()
    (elsewhere / "by_path.py").write_text("from adx.agents import App\nx = App('x')\n")
    assert [app.name for app in load_application(os.path.join("sub", "by_path.py")).apps] == ["x"]


async def test_seed_names_and_authoring_versions_of_the_quickstart_agree(
    store: AgentStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two files bench/bench_authoring_loc.py counts implement the same workflow (so the count is fair)."""
    repo = REPO
    payments = tmp_path / "payments.log"
    monkeypatch.setenv("REFUND_PAYMENTS", str(payments))
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("refund_seed", "agents_quickstart"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    seed = build_executables(load_application(str(repo / "bench" / "authoring_loc" / "refund_seed.py")))
    authored = build_executables(load_application(str(repo / "examples" / "agents" / "agents_quickstart.py")))
    await store.ensure_tenant("beta")
    await publish_graphs(store, authored)
    seed_runs = AgentRuns(store, seed)
    client = Client(store, "beta")
    outputs = []
    for tenant, registry, submit in (
        (TENANT, seed, lambda doc: seed_runs.submit(TENANT, "refund", "1", doc)),
        ("beta", authored, lambda doc: client.submit("refund", doc, version=1)),
    ):
        run = await submit({"order_id": "A-1", "amount": 42})
        rejected = await submit({"order_id": "A-2", "amount": 5000})
        assert await seed_runs.resolve(tenant, run.run_id, "approve", {"by": "ann"}) is ResolveOutcome.STORED_EARLY
        scheduler = make_scheduler(store, registry, options=DurableTenantSchedulerOptions(tenant_id=tenant))
        for _ in range(50):
            if all([(await seed_runs.get_run(tenant, r.run_id)).finished for r in (run, rejected)]):
                break
            await scheduler.tick()
        for r in (run, rejected):
            result = await seed_runs.wait(tenant, r.run_id, timeout=5)
            assert result.status is RunStatus.SUCCEEDED, result.failure
            outputs.append({**result.artifact, "payment": bool(result.artifact["payment"])})
    assert outputs[:2] == outputs[2:]
    assert outputs[0] == {"order_id": "A-1", "amount": 42, "status": "refunded", "approved_by": "ann", "payment": True}
    assert outputs[1]["status"] == "rejected: over 1000" and outputs[1]["payment"] is False
    assert len(payments.read_text().splitlines()) == 2
