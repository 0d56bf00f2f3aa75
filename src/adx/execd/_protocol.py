"""Runtime-control wire format (CTL-1..3): newline-delimited JSON objects over Unix stream sockets.

Standard library only: execd (inside every sandbox) and sandboxd (on the host) both import this module.

Two links use it:

1. **execd -> sandboxd**, one connection per sandbox. execd connects to the per-sandbox control socket that
   sandboxd listens on. On every (re)connect execd first sends ``hello`` carrying its *full* current state;
   after that it sends events that each change one part of that state:

   - ``{"type":"hello","protocol":1,"sandboxId":..,"executionId":..,"pid":..,"state":STATE}``
   - ``{"type":"ready"}``
   - ``{"type":"probe","ok":false,"consecutiveFailures":3,"reason":"..."}`` (``ok:true`` once it recovers)
   - ``{"type":"checkpoint_request","operationId":..,"reason":..,"requestedAt":<unix s>}``
   - ``{"type":"activity","version":..,"active":..,"backgroundRunning":..,"admissionOpen":..}`` (coalesced)
   - ``{"type":"workload_exited","exitCode":..}``
   - ``{"type":"reply","requestId":..,"ok":..,"version":..,"error":..}`` answering a request below

   sandboxd -> execd requests on the same connection (control operations: they never bump the activity
   version):

   - ``{"type":"close_admission","requestId":..,"expectedVersion":..}`` (IDLE-6)
   - ``{"type":"open_admission","requestId":..}``
   - ``{"type":"checkpoint_ack","operationId":..}``: sandboxd took the request over; execd forgets it.
     Until then a pending request stays in STATE and is re-sent in every ``hello`` (CTL-7).

2. **sandboxd -> its subscriber** (adxlet), ONE node-level connection (CTL-2/3):

   - ``{"type":"snapshot","seq":..,"protocol":1,"sandboxes":{sandboxId: STATE}}`` first, on every
     (re)subscribe;
   - ``{"type":"delta","seq":..,"sandboxId":..,"state":STATE | null}`` afterwards, coalesced per sandbox;
     ``null`` means the execd connection was lost: the observation is cleared (no fresh information);
   - ``{"type":"reply","requestId":..,"ok":..,...}`` answering a subscriber request;

   and the subscriber may send ``close_admission`` / ``open_admission`` / ``checkpoint_ack`` with an extra
   ``sandboxId``; sandboxd forwards them to that sandbox's execd.

STATE is :class:`SandboxState` (camelCase keys, JSON-ready).

Versions (CTL-8): execd, sandboxd and the node ship as one version and speak ``PROTOCOL_VERSION``. A peer that
speaks another is refused with a reason, never served half-understood: sandboxd publishes a refused execd as
``STATE.refused`` (the node fails that execution with it), and a subscriber refuses a snapshot of another
protocol (the node does not start).
"""

from __future__ import annotations

import json
from typing import TypeAlias, TypedDict, cast

__all__ = [
    "MAX_LINE",
    "PROTOCOL_VERSION",
    "ActivityState",
    "CheckpointRequest",
    "ProbeState",
    "ProtocolError",
    "SandboxState",
    "apply_event",
    "decode",
    "encode",
    "initial_state",
]

PROTOCOL_VERSION = 1
#: Longest accepted line; a longer one is a protocol error (protects both sides' memory).
MAX_LINE = 1 << 20

# execd -> sandboxd
HELLO = "hello"
READY = "ready"
PROBE = "probe"
CHECKPOINT_REQUEST = "checkpoint_request"
ACTIVITY = "activity"
WORKLOAD_EXITED = "workload_exited"
REPLY = "reply"
# sandboxd -> execd (and subscriber -> sandboxd, with sandboxId)
CLOSE_ADMISSION = "close_admission"
OPEN_ADMISSION = "open_admission"
CHECKPOINT_ACK = "checkpoint_ack"
# sandboxd -> subscriber
SNAPSHOT = "snapshot"
DELTA = "delta"


#: One control message as it travels: a JSON object whose string ``type`` says which fields it has. Messages come
#: from the peer (sandboxd or execd), so a reader checks each field it uses (``_int``, :func:`apply_event`):
#: ``object`` values make the type checker insist on that.
Message: TypeAlias = dict[str, object]


class Reply(TypedDict, total=False):
    """execd's answer to a request of sandboxd (``requestId`` pairs them)."""

    type: str  # REPLY
    requestId: object  # as the request had it
    ok: bool
    version: int  # the activity version after the request
    admissionOpen: bool
    error: str | None  # why not ok
    field: str  # the request's field that was invalid


class ProtocolError(ValueError):
    """A line that is not a valid control message."""


class ActivityState(TypedDict):
    version: int
    active: int
    backgroundRunning: int
    admissionOpen: bool


class ProbeState(TypedDict):
    ok: bool
    consecutiveFailures: int
    reason: str | None


class CheckpointRequest(TypedDict):
    operationId: str
    reason: str | None
    requestedAt: float


class SandboxState(TypedDict):
    ready: bool
    probe: ProbeState | None
    activity: ActivityState
    checkpointRequests: list[CheckpointRequest]
    workloadExitCode: int | None
    #: Set by sandboxd, never by execd: why it refused this execd's connection (CTL-8: another protocol).
    refused: str | None


def initial_state() -> SandboxState:
    return {
        "ready": False,
        "probe": None,
        "activity": {"version": 0, "active": 0, "backgroundRunning": 0, "admissionOpen": True},
        "checkpointRequests": [],
        "workloadExitCode": None,
        "refused": None,
    }


def encode(message: object) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> Message:
    """Parse one line into a message with a string ``type``; raise :class:`ProtocolError` otherwise."""
    if len(line) > MAX_LINE:
        raise ProtocolError(f"line longer than {MAX_LINE} bytes")
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise ProtocolError(f"invalid JSON: {exc}") from None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ProtocolError("a message must be a JSON object with a string 'type'")
    return value


def _optional_text(message: Message, key: str) -> str | None:
    value = message.get(key)
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"{message['type']}.{key} must be a string or null")
    return value


def _int(message: Message, key: str) -> int:
    value = message.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"{message['type']}.{key} must be an integer")
    return value


def apply_event(state: SandboxState, message: Message) -> bool:
    """Fold one execd event into ``state`` (in place). Return whether the state changed.

    ``hello`` replaces the whole state; ``reply`` and unknown types leave it alone (forward compatibility:
    an older sandboxd ignores event types a newer execd adds).
    """
    kind = message["type"]
    if kind == HELLO:
        new = message.get("state")
        if not isinstance(new, dict):
            raise ProtocolError("hello.state must be an object")
        merged = initial_state()
        merged.update(new)  # type: ignore[typeddict-item]
        changed = merged != state
        # TypedDicts have no clear(); the same object must be updated in place for its holders.
        plain = cast(dict[str, object], state)
        plain.clear()
        plain.update(merged)
        return changed
    if kind == READY:
        changed = not state["ready"]
        state["ready"] = True
        return changed
    if kind == PROBE:
        probe: ProbeState = {
            "ok": bool(message.get("ok")),
            "consecutiveFailures": _int(message, "consecutiveFailures"),
            "reason": _optional_text(message, "reason"),
        }
        changed = state["probe"] != probe
        state["probe"] = probe
        return changed
    if kind == ACTIVITY:
        activity: ActivityState = {
            "version": _int(message, "version"),
            "active": _int(message, "active"),
            "backgroundRunning": _int(message, "backgroundRunning"),
            "admissionOpen": bool(message.get("admissionOpen")),
        }
        changed = state["activity"] != activity
        state["activity"] = activity
        return changed
    if kind == CHECKPOINT_REQUEST:
        op = message.get("operationId")
        if not isinstance(op, str) or not op:
            raise ProtocolError("checkpoint_request.operationId must be a non-empty string")
        if any(item["operationId"] == op for item in state["checkpointRequests"]):
            return False  # duplicates never add a second item (CTL-7)
        requested_at = message.get("requestedAt", 0)
        if not isinstance(requested_at, int | float) or isinstance(requested_at, bool):
            raise ProtocolError("checkpoint_request.requestedAt must be a number")
        state["checkpointRequests"].append(
            {"operationId": op, "reason": _optional_text(message, "reason"), "requestedAt": float(requested_at)}
        )
        return True
    if kind == CHECKPOINT_ACK:
        op = message.get("operationId")
        before = len(state["checkpointRequests"])
        state["checkpointRequests"] = [i for i in state["checkpointRequests"] if i["operationId"] != op]
        return len(state["checkpointRequests"]) != before
    if kind == WORKLOAD_EXITED:
        code = _int(message, "exitCode")
        changed = state["workloadExitCode"] != code
        state["workloadExitCode"] = code
        return changed
    return False
