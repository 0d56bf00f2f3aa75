"""The node's report loop (NOD-2): register, then every ``report_interval_seconds`` heartbeat and report a
capacity sample to the Coordinator, through one function whatever the runtime is.

A transport failure closes admission of new Environments locally and keeps the rest going (NOD-6); an
explicit session rejection requires a fresh registration under a new session and, before admission opens
again, the node's barrier (``retake_pending``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from dataclasses import KW_ONLY, dataclass, field

import grpc

from adx._grpc_errors import from_rpc_error
from adx.errors import AdxError, ConflictError, NotFoundError, UnavailableError, UncertainOutcomeError
from adx.model import new_id
from adx.node._pressure import PressureMonitor
from adx.node._resources import CapacityTracker
from adx.proto import coordinator_pb2 as pb
from adx.proto import coordinator_pb2_grpc as pb_grpc

log = logging.getLogger("adx.node.reporter")


@dataclass
class ReportState:
    session: str = ""
    registered: bool = False
    coordinator_reachable: bool = False
    last_report_at: float = 0.0
    reports: int = 0
    failures: int = 0
    last_error: str = ""
    #: NOD-6: the Coordinator rejected our session; after the new handshake, admission stays closed until the
    #: node's barrier (drain, catalog and runtime recovery) has run: see ``retaken``.
    retake_pending: bool = False


@dataclass(eq=False)
class Reporter:
    """What the node says about itself on registration and every report, and the state of that conversation."""

    stub: pb_grpc.CoordinatorAsyncStub
    _: KW_ONLY
    node: str
    address: str
    relay_address: str
    tracker: CapacityTracker
    interval: float
    rpc_timeout: float
    checkpoint_capable: bool = False
    shared_storage: bool = False
    pressure: PressureMonitor | None = None
    cpu_overcommit: float = 1.0
    state: ReportState = field(default_factory=ReportState, init=False)

    @property
    def admission_open(self) -> bool:
        """Local admission of new Environments: needs the Coordinator reachable and a fresh sample."""
        return (
            self.state.registered
            and self.state.coordinator_reachable
            and not self.state.retake_pending
            and self.tracker.admission_open()
        )

    @property
    def closed_reason(self) -> str:
        """Why the node admits nothing new now ("" while it admits): visible in errors, the NodeRecord, metrics."""
        if not self.state.registered:
            return "not registered with the Coordinator"
        if not self.state.coordinator_reachable:
            return "the Coordinator is unreachable"
        if self.state.retake_pending:
            return "a session re-take is in progress"
        return self.tracker.closed_reason()

    def retaken(self) -> None:
        """The node finished its barrier after a new handshake (NOD-6): admission may open again."""
        self.state.retake_pending = False

    async def _rpc(self, what: str, call: Awaitable[object]) -> object:
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc, what) from None

    async def register(self) -> None:
        """A new process session every registration (fresh identity per process and per re-takeover)."""
        session = new_id("ses")
        await self._rpc(
            "register",
            self.stub.RegisterNode(
                pb.RegisterNodeRequest(
                    node=self.node,
                    session=session,
                    address=self.address,
                    relay_address=self.relay_address,
                    checkpoint_capable=self.checkpoint_capable,
                    shared_storage=self.shared_storage,
                ),
                timeout=self.rpc_timeout,
            ),
        )
        self.state.session = session
        self.state.registered = True
        self.state.coordinator_reachable = True
        log.info("registered with the coordinator", extra={"node": self.node, "session": session})

    async def report_once(self) -> None:
        """Heartbeat, then a capacity sample (only once a valid sample exists: RES-6)."""
        now = time.time()
        if self.pressure is not None:
            # RES-7: pressure closes and reopens admission; running Environments are never touched by it.
            gate = await self.pressure.check()
            self.tracker.pressure_closed, self.tracker.pressure_reason = gate.closed, gate.reason
        sample = await self.tracker.refresh(now)
        try:
            if not self.state.registered:
                await self.register()
            await self._rpc(
                "heartbeat",
                self.stub.Heartbeat(
                    pb.HeartbeatRequest(node=self.node, session=self.state.session), timeout=self.rpc_timeout
                ),
            )
            if sample is not None:
                # A failed read re-sends the old sample with its *original* validity: never renewed (RES-6).
                await self._rpc(
                    "report capacity",
                    self.stub.ReportCapacity(
                        pb.ReportCapacityRequest(
                            node=self.node,
                            session=self.state.session,
                            capacity_json=sample.capacity.model_dump_json(by_alias=True),
                            valid_for_seconds=max(sample.valid_until - time.time(), 0.0),
                            admission_open=self.tracker.admission_open(),
                            admission_reason=self.tracker.closed_reason(),
                            devices=list(sample.devices),
                            cpu_overcommit=self.cpu_overcommit,
                        ),
                        timeout=self.rpc_timeout,
                    ),
                )
            self.state.coordinator_reachable = True
            self.state.reports += 1
            self.state.last_report_at = now
            self.state.last_error = ""
        except (ConflictError, NotFoundError) as exc:
            # Session rejected or expired, or the node unknown to the Coordinator (NOD-6): register again
            # under a new session on the next round; admission stays closed until the barrier re-took ownership.
            self.state.registered = False
            self.state.retake_pending = True
            self._failed(exc)
        except (UnavailableError, UncertainOutcomeError) as exc:
            self.state.coordinator_reachable = False
            self._failed(exc)
        except AdxError as exc:
            self._failed(exc)

    def _failed(self, exc: AdxError) -> None:
        self.state.failures += 1
        self.state.last_error = str(exc)
        log.warning("report failed: %s", exc, extra={"node": self.node})
