"""The Python SDK: ``adx.Client`` / ``adx.AsyncClient`` over the public HTTP API (imports only adx.model,
adx.errors, adx._backoff (standard library only) and httpx)."""

from adx.errors import AuthenticationError
from adx.model import CheckpointStorage, EnvironmentLogs, EnvironmentState, EnvironmentStats, IdleAction, LogEntry
from adx.sdk._async import AsyncClient, AsyncCommandStream, AsyncEnvironment
from adx.sdk._client import Client, CommandStream, Environment
from adx.sdk._errors import BadResponseError, WaitTimeoutError
from adx.sdk._models import CommandResult, OutputChunk
from adx.sdk._pty import AsyncPty, Pty, PtySize
from adx.sdk._settings import credentials_path, read_credentials, resolve, write_credentials
from adx.sdk._spec import PausePolicy, RestartPolicy, Retention, build_spec
from adx.sdk._tokens import AsyncTokens, Tokens
from adx.sdk._volumes import AsyncVolumes, Volumes

__all__ = [
    "AsyncClient",
    "AsyncCommandStream",
    "AsyncEnvironment",
    "AsyncPty",
    "AsyncTokens",
    "AsyncVolumes",
    "AuthenticationError",
    "BadResponseError",
    "CheckpointStorage",
    "Client",
    "CommandResult",
    "CommandStream",
    "Environment",
    "EnvironmentLogs",
    "EnvironmentState",
    "EnvironmentStats",
    "IdleAction",
    "LogEntry",
    "OutputChunk",
    "PausePolicy",
    "Pty",
    "PtySize",
    "RestartPolicy",
    "Retention",
    "Tokens",
    "Volumes",
    "WaitTimeoutError",
    "build_spec",
    "credentials_path",
    "read_credentials",
    "resolve",
    "write_credentials",
]
