"""An Environment's workload output (its entrypoint's stdout and stderr), as its node keeps it. HTTP: camelCase."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from adx.model._base import ApiModel

#: At most this many lines in one answer (``limit`` and ``tail``).
MAX_LOG_LINES = 10_000
#: A waiting read (``waitSeconds``) waits at most this long for a new line.
MAX_LOG_WAIT_SECONDS = 60.0


class LogEntry(ApiModel):
    """One line of output: the stream it came from and when the node read it."""

    time: datetime = Field(description="when the node read the line (UTC)")
    stream: Literal["stdout", "stderr"]
    text: str = Field(description="the line without its newline (invalid UTF-8 replaced)")
    partial: bool = Field(
        default=False, description="no newline ended it: cut at 16 KiB, written after 0.5 s without one, or the end"
    )
    execution_id: str = Field(description="the execution that wrote it (a restart or resume starts a new one)")


class EnvironmentLogs(ApiModel):
    """A page of an Environment's output, oldest first; pass ``cursor`` back to read on (follow)."""

    environment_id: str
    node: str = Field(description="the node that keeps these logs")
    lines: list[LogEntry]
    cursor: str = Field(description="opaque; the next read with it returns only newer lines")
    truncated: bool = Field(
        default=False, description="rotation removed output between the cursor given and these lines"
    )
