"""Placement: which nodes may take a request, best first. Pure; the store re-checks atomically."""

from __future__ import annotations

from dataclasses import dataclass

from adx.model import NodeRecord, Resources

#: How a refusal for want of room begins (the Lua admission says the same: ``_scripts._ADMIT``).
NO_CAPACITY = "no capacity"


@dataclass(frozen=True)
class Refusal:
    node: str
    reason: str


def eligibility(
    node: NodeRecord, need: Resources, now: float, *, needs_checkpoint: bool = False, needs_shared_storage: bool = False
) -> str | None:
    """None if ``node`` may take ``need`` now, else why not (RES-4, RES-6, ENV-2, ENV-3)."""
    if node.session_expires_at < now:
        return "node session expired"
    if not node.admission_open:
        return "node admission closed" + (f" ({node.admission_reason})" if node.admission_reason else "")
    if node.capacity_valid_until < now:
        return "node capacity sample expired"
    if needs_checkpoint and not node.checkpoint_capable:
        return "node cannot checkpoint (idleAction pause needs it)"
    if needs_shared_storage and not node.shared_storage:
        return "node has no shared checkpoint storage (pauseOptions.storage 'shared' needs it)"
    # CPU up to capacity x the node's overcommit ratio; memory and disk up to capacity (RES-4).
    short = need.shortfall(node.allocatable)
    if short:
        return f"{NO_CAPACITY}: " + ",".join(short)
    return None


def rank_nodes(
    nodes: list[NodeRecord],
    need: Resources,
    now: float,
    *,
    needs_checkpoint: bool = False,
    needs_shared_storage: bool = False,
) -> tuple[list[NodeRecord], list[Refusal]]:
    """Eligible nodes, the one with the most room left after placement first (spreads load); and refusals.

    Room is measured against each node's admission limit, so an overcommitted node's CPU counts as the share of
    its limit that is left (a 4x node half full ranks like a 1x node half full)."""
    eligible: list[NodeRecord] = []
    refused: list[Refusal] = []
    for node in nodes:
        reason = eligibility(
            node, need, now, needs_checkpoint=needs_checkpoint, needs_shared_storage=needs_shared_storage
        )
        if reason is None:
            eligible.append(node)
        else:
            refused.append(Refusal(node.name, reason))

    def headroom(node: NodeRecord) -> tuple[float, float, str]:
        free, limit = node.allocatable, node.limit
        cpu = (free.cpu_millis - need.cpu_millis) / limit.cpu_millis if limit.cpu_millis else 0.0
        mem = (
            (free.memory_bytes - need.memory_bytes) / node.capacity.memory_bytes if node.capacity.memory_bytes else 0.0
        )
        return (-min(cpu, mem), -(cpu + mem), node.name)

    eligible.sort(key=headroom)
    return eligible, refused


def count_placed(node: NodeRecord, need: Resources) -> NodeRecord:
    """``node``'s cached record with ``need`` reserved as well: what ranking must see right after a placement.

    The Coordinator ranks from cached node records that the nodes' reports refresh (every few seconds); without
    this, every create between two reports saw the same room and went to the same node (bench_control_plane:
    all 50 of a burst on one of two nodes). Admission itself stays the store's atomic check; a report that read
    the store after this placement may count it twice until the next report, which only tilts ranking."""
    return node.model_copy(update={"reserved": node.reserved + need})
