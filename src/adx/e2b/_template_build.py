"""Running an E2B template build: in the background of the API process, on a node's sandboxd, one at a time.

A build runs in a thread of its own with its own event loop: the image builder does file work (COPY layers, the
layer commits, a first Debian base build of minutes) that must not stall the API's loop. Each step's progress
becomes E2B log entries, written into the build's record as they come, so ``GET .../status`` on any API replica
sharing the store sees them. Builds queue (status ``waiting``) behind the one running: every RUN step is a sandbox,
and builds in parallel would only slow each other on a small node.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from adx.e2b._template_steps import BuildStart
from adx.e2b._template_store import BuildReason, BuildRecord, BuildStatus, Level, LogEntry, TemplateStore
from adx.e2b._template_tags import image_of
from adx.errors import AdxError, ImageBuildError
from adx.images import ImageStore, Instruction, ensure_debian_image
from adx.sandboxd import SandboxdClient
from adx.sandboxd._image_build import StepEvent, build_steps

__all__ = ["BuildJob", "TemplateBuilder"]

_log = logging.getLogger(__name__)
#: Lines of a RUN step's output kept as log entries (its tail: the end says why it failed).
OUTPUT_LINES = 200
#: Memory of a build step's sandbox when the template asks for none (E2B's default sandbox: 512 MiB).
DEFAULT_STEP_MEMORY_BYTES = 1 << 30
_BLOB_PREFIX = re.compile(r"\b[0-9a-f]{64}/")


@dataclass(frozen=True)
class BuildJob:
    record: BuildRecord
    start: BuildStart
    steps: list[Instruction]
    memory_bytes: int


def _step_name(line: int) -> str:
    return "base" if line == 0 else str(line)


class TemplateBuilder:
    """The builds this API process runs; ``start`` returns at once, the build goes on in its thread."""

    def __init__(self, templates: TemplateStore, images: ImageStore, socket: Path, context_root: Path) -> None:
        self.templates = templates
        self.images = images
        self.socket = socket
        self.context_root = context_root
        self._slot = threading.Semaphore(1)
        self._threads: dict[str, threading.Thread] = {}

    def start(self, job: BuildJob, on_ready: Callable[[BuildRecord], None]) -> None:
        # A daemon thread: an API server that stops does not wait minutes for a build (its record then says
        # the build was interrupted: the status route sees its owner gone).
        thread = threading.Thread(
            target=self._run, args=(job, on_ready), name=f"e2b-build-{job.record.id}", daemon=True
        )
        self._threads[job.record.id] = thread
        thread.start()

    def _run(self, job: BuildJob, on_ready: Callable[[BuildRecord], None]) -> None:
        record = job.record
        lock = threading.Lock()

        def log(*messages: str, level: Level = "info", step: str | None = None) -> None:
            # One record write per call (a whole step's output is one call): pollers on any replica see it.
            now = time.time()
            with lock:
                record.logs += [LogEntry(timestamp=now, level=level, message=m, step=step) for m in messages]
                self.templates.put_build(record)

        try:
            with self._slot:
                record.status = BuildStatus.BUILDING
                base = job.steps[0].args[0]
                log(f"Building template {record.template} ({len(job.start.steps)} steps) on image {base}")
                self._build(job, log)
                record.status = BuildStatus.READY
                on_ready(record)
                log(f"Template {record.template} is ready", step="finalize")
        except ImageBuildError as exc:
            line = exc.details.get("line")
            step = _step_name(line) if isinstance(line, int) else None
            message = exc.message.split(": ", 1)[1] if exc.message.startswith("line ") else exc.message
            self._fail(record, log, f"step {step}: {message}" if step else message, step)
        except AdxError as exc:
            self._fail(record, log, exc.message, None)
        except Exception as exc:  # the record must end, whatever broke
            _log.exception("template build %s failed", record.id)
            self._fail(record, log, f"internal error: {type(exc).__name__}: {exc}", None)
        finally:
            record.finished_at = time.time()
            with lock:
                self.templates.put_build(record)
            self._threads.pop(record.id, None)

    @staticmethod
    def _fail(record: BuildRecord, log: Callable[..., None], message: str, step: str | None) -> None:
        record.status = BuildStatus.ERROR
        record.reason = BuildReason(message=message, step=step)
        log(message, level="error", step=step)

    def _build(self, job: BuildJob, log: Callable[..., None]) -> None:
        base = job.steps[0].args[0]
        if base == "debian" and self.images.find("debian") is None:
            log("building the Debian base image (once per node: minutes)", step="base")
            ensure_debian_image(self.images, progress=lambda line: log(line, step="base"))
        lines = {index: ins.line for index, ins in enumerate(job.steps, 1)}

        def on_step(event: StepEvent) -> None:
            step = _step_name(lines.get(event.index, 0))
            # COPY sources live under their upload's digest: the user knows them by their own path.
            label = f"[{step}/{len(job.start.steps)}] {_BLOB_PREFIX.sub('', event.text)[:200]}"
            if event.status == "running":
                log(f"{label} running", step=step)
            elif event.status == "cached":
                log(f"CACHED {label} layer {(event.layer or '')[:12]}", step=step)
            else:  # built, or a step that only changes the manifest (config)
                layer = f", layer {event.layer[:12]}" if event.layer else ""
                log(f"{label} {event.status} in {event.seconds:.1f}s{layer}", step=step)
            if event.output:
                log(*event.output.splitlines()[-OUTPUT_LINES:], step=step)

        async def go() -> None:
            async with SandboxdClient(self.socket) as client:
                result = await build_steps(
                    client,
                    self.images,
                    job.steps,
                    image_of(job.record),
                    context=self.context_root,
                    memory_bytes=job.memory_bytes,
                    progress=on_step,
                    start_cmd=job.start.start_cmd,
                    ready_cmd=job.start.ready_cmd,
                )
            log(
                f"image {result.manifest.name}: {len(result.manifest.layers)} layers, {result.built} steps built, "
                f"{result.cached} cached",
                step="finalize",
            )

        asyncio.run(go())
