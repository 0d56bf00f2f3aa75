"""Domain types shared by every ADX component. No I/O here."""

from adx.model._admin import (
    ADMIN_KEY_PREFIX,
    TENANT_KEY_PREFIX,
    AdminIdentity,
    ClusterStatus,
    DrainEvent,
    DrainStep,
    IssuedKey,
    KeyInfo,
    NodeHealth,
    NodeInfo,
    TenantInfo,
)
from adx.model._base import WholeNumber
from adx.model._ids import CHECKPOINT, ENVIRONMENT, EXECUTION, OPERATION, check_id, new_id
from adx.model._lifecycle import (
    CheckpointStorage,
    HealthProbe,
    IdleAction,
    Lifecycle,
    PauseOptions,
    RestartPolicy,
    Retention,
    RetentionPolicy,
)
from adx.model._logs import MAX_LOG_LINES, MAX_LOG_WAIT_SECONDS, EnvironmentLogs, LogEntry
from adx.model._network import NetworkMode, NetworkPolicy
from adx.model._quantity import MAX_QUANTITY, format_bytes, format_cpu, parse_bytes, parse_cpu_millis
from adx.model._records import CheckpointRef, EnvironmentRecord, NodeRecord, ResumeIntent
from adx.model._resources import MAX_CPU_OVERCOMMIT, Resources, admission_limit, allocatable
from adx.model._spec import EnvironmentSpec, field_path, parse_wire
from adx.model._states import (
    ALLOWED_TRANSITIONS,
    DORMANT_STATES,
    TERMINAL_STATES,
    EnvironmentState,
    can_transition,
    check_transition,
)
from adx.model._stats import EnvironmentStats
from adx.model._view import EnvironmentList, EnvironmentView

__all__ = [
    "ADMIN_KEY_PREFIX",
    "ALLOWED_TRANSITIONS",
    "CHECKPOINT",
    "DORMANT_STATES",
    "ENVIRONMENT",
    "EXECUTION",
    "MAX_CPU_OVERCOMMIT",
    "MAX_LOG_LINES",
    "MAX_LOG_WAIT_SECONDS",
    "MAX_QUANTITY",
    "OPERATION",
    "TENANT_KEY_PREFIX",
    "TERMINAL_STATES",
    "AdminIdentity",
    "CheckpointRef",
    "CheckpointStorage",
    "ClusterStatus",
    "DrainEvent",
    "DrainStep",
    "EnvironmentList",
    "EnvironmentLogs",
    "EnvironmentRecord",
    "EnvironmentSpec",
    "EnvironmentState",
    "EnvironmentStats",
    "EnvironmentView",
    "HealthProbe",
    "IdleAction",
    "IssuedKey",
    "KeyInfo",
    "Lifecycle",
    "LogEntry",
    "NetworkMode",
    "NetworkPolicy",
    "NodeHealth",
    "NodeInfo",
    "NodeRecord",
    "PauseOptions",
    "Resources",
    "RestartPolicy",
    "ResumeIntent",
    "Retention",
    "RetentionPolicy",
    "TenantInfo",
    "WholeNumber",
    "admission_limit",
    "allocatable",
    "can_transition",
    "check_id",
    "check_transition",
    "field_path",
    "format_bytes",
    "format_cpu",
    "new_id",
    "parse_bytes",
    "parse_cpu_millis",
    "parse_wire",
]
