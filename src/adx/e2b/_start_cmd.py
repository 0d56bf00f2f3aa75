"""A template's start and ready commands (``Template().set_start_cmd(start, ready)``), run when a sandbox is
created from it.

E2B runs the start command at the end of the template build and snapshots the sandbox with the process running,
so a sandbox made from the template has it running from the first moment. ADX keeps no process memory in an
image (nor across a pause), so the create does what the build did there: it launches the start command in the
background (``bash -l -c``, as E2B runs commands) as the template's user in its workdir, then runs the ready
command until it exits 0, and only then answers. A start command that ends with a non-zero exit before it is
ready, or a ready command that has not succeeded by the deadline, fails the create with both commands' output
(the caller deletes the sandbox: E2B never hands out a template sandbox that is not ready).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from adx.e2b._ends import EndEvent, end_of, frame_of
from adx.e2b._upstream import CommandBody, Execd, execd_error
from adx.errors import ConflictError
from adx.images import ImageManifest
from adx.model import CommandOutput, CommandState, CommandStatus, ExitFrame, OutputFrame

__all__ = ["StartCommand", "run_start_command", "start_command_of"]

#: Between two runs of the ready command (E2B runs it in a loop until it exits 0).
READY_INTERVAL_SECONDS = 0.2
#: One run of the ready command at most (a hanging check is killed and run again while time remains).
READY_ATTEMPT_SECONDS = 10.0
#: Output kept for the error message, per command and stream.
OUTPUT_CHARS = 2000


@dataclass(frozen=True)
class StartCommand:
    """What a sandbox of a template runs at create: E2B's ``startCmd`` and ``readyCmd``, as the template's user
    in its workdir."""

    start: str | None
    ready: str | None
    user: str
    workdir: str

    def argv(self, command: str) -> list[str]:
        return ["/bin/bash", "-l", "-c", command]  # as the SDK's commands.run: a login shell


def start_command_of(manifest: ImageManifest | None) -> StartCommand | None:
    """The image's start/ready commands, None when it has neither (any image that is not such a template)."""
    if manifest is None or not (manifest.start_cmd or manifest.ready_cmd):
        return None
    return StartCommand(manifest.start_cmd or None, manifest.ready_cmd or None, manifest.user, manifest.workdir)


@dataclass
class _Run:
    """One run of a command: how it ended (envd's rule, as the SDK would see it) and its combined output."""

    end: EndEvent | None  # None: the stream ended without an end frame
    output: str

    @property
    def succeeded(self) -> bool:
        return self.end is not None and self.end.succeeded

    def describe(self) -> str:
        if self.end is None:
            return f"no exit status, output {self.output!r}"
        why = f" ({self.end.error})" if self.end.error and self.end.error != self.end.status else ""
        return f"exit code {self.end.exit_code}{why}, output {self.output!r}"


def frames_result(body: bytes) -> _Run:
    """A foreground execd answer (NDJSON: start, output frames, end) as its end and combined output."""
    output: list[str] = []
    end: EndEvent | None = None
    for line in body.splitlines():
        if not line.strip():
            continue
        frame = frame_of(line)
        if isinstance(frame, OutputFrame):
            output.append(frame.data)
        elif isinstance(frame, ExitFrame):
            end = end_of(frame)
    return _Run(end, "".join(output)[-OUTPUT_CHARS:])


async def _launch(execd: Execd, command: StartCommand, env: dict[str, str]) -> str:
    """The start command, in the background (it outlives the create); its execd ID."""
    assert command.start is not None
    body: CommandBody = {
        "argv": command.argv(command.start),
        "background": True,
        "user": command.user,
        "cwd": command.workdir,
        "env": env,
    }
    status, answer = await execd.call("POST", "/v1/commands", json_body=body)
    if status != 201:
        code, message = execd_error(answer)
        raise ConflictError(f"the template's start command {command.start!r} could not be started: {message} ({code})")
    return CommandStatus.model_validate_json(answer).id


async def _ended(execd: Execd, command_id: str) -> _Run | None:
    """The start command's end (exit code and output) once it has exited, else None (still running)."""
    status, answer = await execd.call("GET", f"/v1/commands/{command_id}")
    if status != 200:
        return None
    state = CommandStatus.model_validate_json(answer)
    if state.state is CommandState.RUNNING:
        return None
    output = []
    for stream in ("stdout", "stderr"):
        got, text = await execd.call("GET", f"/v1/commands/{command_id}/output", query={"stream": stream})
        if got == 200:
            output.append(CommandOutput.model_validate_json(text).data)
    return _Run(end_of(state), "".join(output)[-OUTPUT_CHARS:])


async def _ready_once(execd: Execd, command: StartCommand, env: dict[str, str], seconds: float) -> _Run:
    assert command.ready is not None
    body: CommandBody = {
        "argv": command.argv(command.ready),
        "user": command.user,
        "cwd": command.workdir,
        "env": env,
        "timeoutSeconds": max(0.1, min(READY_ATTEMPT_SECONDS, seconds)),
    }
    status, answer = await execd.call("POST", "/v1/commands", json_body=body)
    if status != 200:
        code, message = execd_error(answer)
        raise ConflictError(f"the template's ready command {command.ready!r} could not be run: {message} ({code})")
    return frames_result(answer)


async def run_start_command(execd: Execd, command: StartCommand, env: dict[str, str], within: float) -> None:
    """Launch the start command, then run the ready command until it exits 0 (``within`` seconds in all).

    Raises ``ConflictError`` (409, as a sandbox that did not start) naming the command, why, and its output."""
    deadline = time.monotonic() + within
    started = await _launch(execd, command, env) if command.start else None
    if command.ready is None:
        return  # nothing says when it is ready: launched is all E2B's build would have waited for either
    last: _Run | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining > 0:
            last = await _ready_once(execd, command, env, remaining)
            if last.succeeded:
                return
        if started is not None:
            ended = await _ended(execd, started)
            if ended is not None and not ended.succeeded:
                assert ended.end is not None  # a command execd reports exited has an end
                raise ConflictError(
                    f"the template's start command {command.start!r} exited with code {ended.end.exit_code} before "
                    f"its ready command {command.ready!r} succeeded; its output: {ended.output!r}"
                )
        if time.monotonic() + READY_INTERVAL_SECONDS >= deadline:
            seen = last.describe() if last is not None else "it never ran"
            raise ConflictError(
                f"the template's ready command {command.ready!r} did not succeed within {within:g} s (its last run:"
                f" {seen}); the start command {command.start!r} runs as {command.user!r} in {command.workdir}"
            )
        await asyncio.sleep(READY_INTERVAL_SECONDS)
