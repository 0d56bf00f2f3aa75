"""Runtimes that run Environment executions, behind one protocol (RuntimeDriver)."""

from adx.runtime._driver import (
    DriverCapabilities,
    Execution,
    ExecutionSpec,
    ExecutionState,
    ExitInfo,
    InventoryItem,
    RuntimeDriver,
)

__all__ = [
    "DriverCapabilities",
    "Execution",
    "ExecutionSpec",
    "ExecutionState",
    "ExitInfo",
    "InventoryItem",
    "RuntimeDriver",
]
