"""ADX: sandboxed Environments and durable agent runs for AI agents.

This package's public names are the Python SDK's::

    import adx
    client = adx.Client()            # or adx.Client(api_url=..., api_key=...)
    env = client.environments.create(cpu=1, memory="512Mi")
    print(env.commands.run("echo hi").stdout)

The names load on first use (PEP 562): every ADX daemon imports this package too, and execd, PID 1 of each
sandbox, must not pay for httpx and pydantic it never uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adx.errors import (
        AdxError,
        ConflictError,
        InvalidInputError,
        NotFoundError,
        UnavailableError,
        UncertainOutcomeError,
    )
    from adx.sdk import (
        AsyncClient,
        AsyncCommandStream,
        AsyncEnvironment,
        CheckpointStorage,
        Client,
        CommandResult,
        CommandStream,
        Environment,
        EnvironmentState,
        EnvironmentStats,
        IdleAction,
        OutputChunk,
        PausePolicy,
        RestartPolicy,
        Retention,
        WaitTimeoutError,
    )

__all__ = [
    "AdxError",
    "AsyncClient",
    "AsyncCommandStream",
    "AsyncEnvironment",
    "CheckpointStorage",
    "Client",
    "CommandResult",
    "CommandStream",
    "ConflictError",
    "Environment",
    "EnvironmentState",
    "EnvironmentStats",
    "IdleAction",
    "InvalidInputError",
    "NotFoundError",
    "OutputChunk",
    "PausePolicy",
    "RestartPolicy",
    "Retention",
    "UnavailableError",
    "UncertainOutcomeError",
    "WaitTimeoutError",
]

_ERRORS = frozenset(
    {"AdxError", "ConflictError", "InvalidInputError", "NotFoundError", "UnavailableError", "UncertainOutcomeError"}
)


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'adx' has no attribute {name!r}")
    import importlib

    module = importlib.import_module("adx.errors" if name in _ERRORS else "adx.sdk")
    value = getattr(module, name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
