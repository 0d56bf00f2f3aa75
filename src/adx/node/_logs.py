"""Workload logs on the node: reading an Environment's output for the API, and reclaiming it (MET-5).

The runtime keeps the output per Environment (sandboxd's log group = the Environment ID): every execution —
restarts (RST-2), resumes — appends to it. The node answers for Environments it holds (running, paused or
failed here), never waking one. Reclamation starts once the startup takeover is done, runs every period and
removes only groups of Environments the node neither holds (a Controller) nor has an unconfirmed cleanup of
(NOD-13 orphans); it lists the runtime's log groups, never its sandboxes (no runtime scan).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from datetime import datetime

from adx.errors import AdxError, InvalidInputError
from adx.model import MAX_LOG_LINES, MAX_LOG_WAIT_SECONDS, EnvironmentLogs, LogEntry
from adx.runtime._sandboxd import SandboxdDriver
from adx.sandboxd import LogsRequest

__all__ = ["WorkloadLogs"]

log = logging.getLogger("adx.node.logs")

DEFAULT_LIMIT = 1000


class WorkloadLogs:
    def __init__(
        self, driver: SandboxdDriver, known: Callable[[], Collection[str]], *, node: str, interval: float
    ) -> None:
        self.driver = driver
        self.known = known
        self.node = node
        self.interval = interval

    async def read(
        self,
        env_id: str,
        *,
        cursor: str = "",
        tail: int | None = None,
        since: str = "",
        limit: int = 0,
        wait_seconds: float = 0.0,
    ) -> EnvironmentLogs:
        if tail is not None and not 0 <= tail <= MAX_LOG_LINES:
            raise InvalidInputError("tail", f"must be between 0 and {MAX_LOG_LINES}, got {tail}")
        if not 0 <= limit <= MAX_LOG_LINES:
            raise InvalidInputError("limit", f"must be between 1 and {MAX_LOG_LINES}, got {limit}")
        if not 0 <= wait_seconds <= MAX_LOG_WAIT_SECONDS:
            raise InvalidInputError("waitSeconds", f"must be between 0 and {MAX_LOG_WAIT_SECONDS:g}")
        try:
            since_time = datetime.fromisoformat(since.replace("Z", "+00:00")) if since else None
        except ValueError:
            raise InvalidInputError("since", f"must be an RFC 3339 time, got {since[:40]!r}") from None
        answer = await self.driver.logs(
            LogsRequest(
                group=env_id,
                cursor=cursor or None,
                tail=tail,
                since=since_time,
                limit=limit or DEFAULT_LIMIT,
                wait_seconds=wait_seconds,
            )
        )
        return EnvironmentLogs(
            environment_id=env_id,
            node=self.node,
            lines=[
                LogEntry(
                    time=line.time,
                    stream=line.stream,
                    text=line.text,
                    partial=line.partial,
                    execution_id=line.execution,
                )
                for line in answer.lines
            ],
            cursor=answer.cursor,
            truncated=answer.truncated,
        )

    async def sweep(self) -> list[str]:
        """MET-5: remove the log groups of Environments this node no longer knows; returns the removed ones."""
        groups = await self.driver.log_groups()
        known = set(self.known())  # after the listing: an Environment admitted meanwhile is kept
        removed = []
        for group in groups:
            if group not in known:
                await self.driver.delete_logs(group)
                removed.append(group)
        if removed:
            log.info("reclaimed workload logs", extra={"node": self.node, "environments": removed})
        return removed

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every ``interval`` until ``stop`` (started after the startup takeover)."""
        while not stop.is_set():
            try:
                await self.sweep()
            except AdxError as exc:  # the runtime is away: the next period retries
                log.warning("log reclamation skipped: %s", exc, extra={"node": self.node})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
