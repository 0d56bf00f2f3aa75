"""Runtimes that run Environment executions, behind one protocol (RuntimeDriver)."""

from adx.runtime._driver import (
    Artifact,
    DriverCapabilities,
    Execution,
    ExecutionSpec,
    ExecutionState,
    ExecutionStats,
    ExitInfo,
    InventoryItem,
    RuntimeDriver,
)

__all__ = [
    "Artifact",
    "DriverCapabilities",
    "Execution",
    "ExecutionSpec",
    "ExecutionState",
    "ExecutionStats",
    "ExitInfo",
    "InventoryItem",
    "RuntimeDriver",
]
