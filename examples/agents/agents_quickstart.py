"""A refund agent in four steps: check the request, wait for a human approval, pay (a side effect that
happens exactly once, even if the worker crashes mid-payment), then mark the refund done.

Terminal 1:  adx agent dev agents_quickstart       # PostgreSQL + a worker; prints the database URL
Terminal 2:  export ADX_AGENT_DATABASE_URL=...     # as printed
             python agents_quickstart.py           # submits, approves, prints the result
"""

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel

from adx.agents import END, App, Client, Goto, Interrupt, Reconciled, ToolCall, resolution

PAYMENTS = Path(os.environ.get("REFUND_PAYMENTS", "payments.log"))


class Refund(BaseModel):
    order_id: str
    amount: int
    status: str = "new"
    approved_by: str | None = None
    payment: str | None = None


app = App("refund", version=1)


def append_line(line: str) -> None:
    # One O_APPEND write, then fsync: a line is in the file whole or not at all.
    fd = os.open(PAYMENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def paid(key: str) -> bool:
    lines = PAYMENTS.read_text().splitlines() if PAYMENTS.exists() else []
    return any(line.split(" ", 1)[0] == key for line in lines)


async def find_payment(args: dict, call: ToolCall) -> Reconciled:
    # Asked only if a worker died mid-payment: did that payment happen? Look for its idempotency key.
    if await asyncio.to_thread(paid, call.idempotency_key):
        return Reconciled.done({"payment": call.idempotency_key})
    return Reconciled.not_done()


@app.tool(idempotent=False, reconcile=find_payment)
async def pay(args: dict, call: ToolCall) -> dict:
    await asyncio.to_thread(append_line, f"{call.idempotency_key} {args['order_id']} {args['amount']}\n")
    return {"payment": call.idempotency_key}


@app.node
async def check(state: Refund) -> dict | Goto:
    if state.amount > 1000:
        return Goto(END, {"status": "rejected: over 1000"})
    return {"status": "checked"}


@app.node(interrupts=["approve"])
async def approve(ctx, state: Refund) -> dict | Interrupt:
    decision = resolution(ctx, "approve")
    if decision is None:
        return Interrupt("approve", {"order_id": state.order_id, "amount": state.amount})
    return {"approved_by": decision["by"]}


@app.node
async def pay_out(ctx, state: Refund) -> dict:
    result = await ctx.tool("pay", {"order_id": state.order_id, "amount": state.amount})
    return {"payment": result["payment"]}


@app.node
async def finish(state: Refund) -> dict:
    return {"status": "refunded"}


async def main() -> None:
    async with await Client.connect() as client:  # ADX_AGENT_DATABASE_URL, as `adx agent dev` printed it
        run = await client.submit("refund", {"order_id": "A-1001", "amount": 42}, version=1)
        print("submitted", run.run_id)
        await client.resolve(run, "approve", {"by": "ann"})  # early or while it waits: both work
        done = await client.wait(run, output=Refund, timeout=60)
        print(done.status, done.output)


if __name__ == "__main__":
    asyncio.run(main())
