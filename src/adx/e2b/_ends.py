"""execd's command frames, read as ``adx.model`` types, and how a command ended as envd's ``EndEvent`` says it.

One rule for every place that reports a command's end: the process service's ``Start``/``Connect`` streams
(``adx.e2b._process``) and a template's start and ready commands (``adx.e2b._start_cmd``), so a frame means the
same exit code wherever it is read.
"""

from __future__ import annotations

import json
import signal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from adx.model import CommandStarted, CommandStatus, ExitFrame, OutputFrame

__all__ = ["UNKNOWN_END", "EndEvent", "Frame", "end_of", "frame_of"]

#: One NDJSON frame of a foreground command: its start, a piece of output, or its end.
Frame = CommandStarted | OutputFrame | ExitFrame


def frame_of(line: bytes | str) -> Frame:
    """One line of execd's ``POST /v1/commands`` stream (``_stream_foreground``'s three shapes, told by key)."""
    value = json.loads(line)
    if "pid" in value:
        return CommandStarted.model_validate(value)
    if "stream" in value:
        return OutputFrame.model_validate(value)
    return ExitFrame.model_validate(value)


class EndEvent(BaseModel):
    """envd's ``process.EndEvent`` (Connect JSON): what the SDK turns into a ``CommandResult``."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    exit_code: int
    exited: bool
    status: str
    error: str | None = None

    def wire(self) -> dict[str, object]:
        return self.model_dump(by_alias=True, exclude_none=True)

    @property
    def succeeded(self) -> bool:
        """Exit 0 and no error: a command that ran out of time has not succeeded even when it exited 0."""
        return self.exit_code == 0 and self.error is None


#: The end of a command that finished unseen (execd forgot it, and this process did not stream it).
UNKNOWN_END = EndEvent(
    exit_code=-1, exited=False, status="unknown", error="the command ended; its exit status is not known here"
)


def end_of(end: ExitFrame | CommandStatus) -> EndEvent:
    """execd's end of a command as envd's EndEvent: a signal is exit code -1 with ``exited`` false (Go's
    os/exec), otherwise the exit code; a timed-out command carries envd's ``context deadline exceeded``."""
    if end.signal:
        try:
            name = (signal.strsignal(end.signal) or str(end.signal)).lower()
        except ValueError:
            name = str(end.signal)
        code, exited, status = -1, False, f"signal: {name}"
    else:
        code = end.exit_code or 0
        exited, status = True, f"exit status {code}"
    if end.timed_out:
        error: str | None = "context deadline exceeded"
    else:
        error = status if code != 0 else None
    return EndEvent(exit_code=code, exited=exited, status=status, error=error)
