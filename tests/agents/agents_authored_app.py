"""An authoring-layer App for worker subprocesses (``registrations = "agents_authored_app:app"``): the seed
test app's non-idempotent ``charge`` tool and its reconcile hook (a ledger row keyed by the idempotency key),
then an approval, written with ``App``, a pydantic state and ``resolution``."""

from __future__ import annotations

from typing import Any

from agents_testapp import charge, reconcile_charge
from pydantic import BaseModel

from adx.agents import App, Interrupt, resolution


class Order(BaseModel):
    amount: int
    charge_id: str | None = None
    approved_by: str | None = None


app = App("authored-order", version=1)
app.tool(charge, idempotent=False, reconcile=reconcile_charge)


@app.node
async def pay(ctx: Any, state: Order) -> dict[str, Any]:
    result = await ctx.tool("charge", {"amount": state.amount})
    return {"charge_id": result["charge_id"]}


@app.node(interrupts=["approve"])
async def approve(ctx: Any, state: Order) -> dict[str, Any] | Interrupt:
    decision = resolution(ctx, "approve")
    if decision is None:
        return Interrupt("approve", {"amount": state.amount})
    return {"approved_by": decision["by"]}
