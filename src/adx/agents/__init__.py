"""ADX durable agent runtime on PostgreSQL.

Assemble an immutable worker deployment: register the three standard audit schemas and the application's
schemas, freeze them, register graphs into an executable registry and freeze it, then build a
:class:`DurableTenantScheduler` (which builds its agent loop internally) and run it in an :class:`AgentWorker`.
"""

from adx.agents._api import AgentRuns
from adx.agents._authoring import START, App, Goto, resolution
from adx.agents._client import Client, Finished
from adx.agents._context import BudgetExceededError, ModelResult, NodeContext, ToolOutcomeUnknownError
from adx.agents._driver import DurableGraphDriverOptions, ShutdownSignal
from adx.agents._environments import EnvironmentAccess, EnvironmentSpec, RunEnvironment
from adx.agents._errors import EvidenceError, SchemaValidationError, StaleFenceError
from adx.agents._fair import DurableFairScheduler, FairnessPolicy, smooth_weighted_sequence, starvation_bound
from adx.agents._graph import (
    END,
    Budget,
    ChildRun,
    ExecutableGraph,
    ExecutableGraphRegistry,
    ExecutableGraphRegistryBuilder,
    Fail,
    GraphBuilder,
    Interrupt,
    Join,
    JoinPolicy,
    ModelChunk,
    ModelProvider,
    Next,
    NodeOutcome,
    NodeWaits,
    Timer,
    Usage,
)
from adx.agents._lifecycle import (
    DurableGraphLifecycleOptions,
    EvidenceRequest,
    ExecutedOutcome,
    GraphLifecycleEvidenceProvider,
    LifecycleEvidence,
    LifecycleResult,
)
from adx.agents._maintenance import AgentMaintenance, AgentMaintenanceHealth, AgentMaintenanceOptions
from adx.agents._pg import CommitHook
from adx.agents._rows import ResolveOutcome, RunKey
from adx.agents._scheduler import DurableTenantScheduler, DurableTenantSchedulerOptions, TickOutcome, TickReport
from adx.agents._schemas import (
    AGENT_CANCELLATION_EVENT_SCHEMA_ID,
    AGENT_MAINTENANCE_EVENT_SCHEMA_ID,
    GRAPH_DRIVER_EVENT_SCHEMA_ID,
    GRAPH_LIFECYCLE_EVENT_SCHEMA_ID,
    JsonSchemaRegistry,
    JsonSchemaRegistryBuilder,
    SchemaLimits,
    SchemaRef,
    register_standard_agent_cancellation_event_schema,
    register_standard_agent_maintenance_event_schema,
    register_standard_graph_driver_event_schema,
    register_standard_graph_lifecycle_event_schema,
)
from adx.agents._status import ChildOutcome, RunStatus, WaitKind, Wake
from adx.agents._store import AgentStore
from adx.agents._tools import Reconciled, ReconcileOutcome, ToolCall
from adx.agents._views import AgentResult, PendingWait, RunEvent, RunPage, RunView
from adx.agents._worker import (
    AgentWorker,
    AgentWorkerBinding,
    AgentWorkerHealth,
    AgentWorkerOptions,
    AgentWorkerReadiness,
)

__all__ = [
    "AGENT_CANCELLATION_EVENT_SCHEMA_ID",
    "AGENT_MAINTENANCE_EVENT_SCHEMA_ID",
    "END",
    "GRAPH_DRIVER_EVENT_SCHEMA_ID",
    "GRAPH_LIFECYCLE_EVENT_SCHEMA_ID",
    "START",
    "AgentMaintenance",
    "AgentMaintenanceHealth",
    "AgentMaintenanceOptions",
    "AgentResult",
    "AgentRuns",
    "AgentStore",
    "AgentWorker",
    "AgentWorkerBinding",
    "AgentWorkerHealth",
    "AgentWorkerOptions",
    "AgentWorkerReadiness",
    "App",
    "Budget",
    "BudgetExceededError",
    "ChildOutcome",
    "ChildRun",
    "Client",
    "CommitHook",
    "DurableFairScheduler",
    "DurableGraphDriverOptions",
    "DurableGraphLifecycleOptions",
    "DurableTenantScheduler",
    "DurableTenantSchedulerOptions",
    "EnvironmentAccess",
    "EnvironmentSpec",
    "EvidenceError",
    "EvidenceRequest",
    "ExecutableGraph",
    "ExecutableGraphRegistry",
    "ExecutableGraphRegistryBuilder",
    "ExecutedOutcome",
    "Fail",
    "FairnessPolicy",
    "Finished",
    "Goto",
    "GraphBuilder",
    "GraphLifecycleEvidenceProvider",
    "Interrupt",
    "Join",
    "JoinPolicy",
    "JsonSchemaRegistry",
    "JsonSchemaRegistryBuilder",
    "LifecycleEvidence",
    "LifecycleResult",
    "ModelChunk",
    "ModelProvider",
    "ModelResult",
    "Next",
    "NodeContext",
    "NodeOutcome",
    "NodeWaits",
    "PendingWait",
    "ReconcileOutcome",
    "Reconciled",
    "ResolveOutcome",
    "RunEnvironment",
    "RunEvent",
    "RunKey",
    "RunPage",
    "RunStatus",
    "RunView",
    "SchemaLimits",
    "SchemaRef",
    "SchemaValidationError",
    "ShutdownSignal",
    "StaleFenceError",
    "TickOutcome",
    "TickReport",
    "Timer",
    "ToolCall",
    "ToolOutcomeUnknownError",
    "Usage",
    "WaitKind",
    "Wake",
    "register_standard_agent_cancellation_event_schema",
    "register_standard_agent_maintenance_event_schema",
    "register_standard_graph_driver_event_schema",
    "register_standard_graph_lifecycle_event_schema",
    "resolution",
    "smooth_weighted_sequence",
    "starvation_bound",
]
