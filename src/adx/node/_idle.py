"""Idle detection (IDLE-1..5): the window runs only while both sides are observed and nothing changes.

Idle means: execd's active client requests = 0 AND the Relay's open streams = 0 AND neither side's activity
version moved for the whole window (IDLE-2). A running background command alone does not block it
(IDLE-3: it counts only when it starts or exits). No execd observation (a broken stream, a lost execd
connection) is no information: the window does not run (IDLE-4). ``idle_timeout_seconds = 0`` never
reclaims (IDLE-1). At the end of the window the Controller acts (IDLE-5).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adx.node._relay import StreamCounts

if TYPE_CHECKING:
    from adx.sandboxd import RuntimeObservation


@dataclass(frozen=True)
class ActivityKey:
    execd_version: int
    relay_version: int


@dataclass
class IdleWindow:
    key: ActivityKey | None = None
    since: float = 0.0


class IdleDetector:
    def __init__(
        self,
        observations: Callable[[], Mapping[str, RuntimeObservation]],
        streams: StreamCounts,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``observations()``: sandbox ID -> execd's last report (``.activity.version/.active``), or absent."""
        self._observations = observations
        self._streams = streams
        self._clock = clock
        self._windows: dict[str, IdleWindow] = {}

    def forget(self, env_id: str) -> None:
        self._windows.pop(env_id, None)

    def quiet_key(self, env_id: str) -> ActivityKey | None:
        """The activity versions the current quiet window started at (None: not quiet)."""
        window = self._windows.get(env_id)
        return window.key if window is not None else None

    def idle_for(self, env_id: str, sandbox_id: str) -> float:
        """Seconds this Environment has been idle without interruption (0 while busy or unobserved)."""
        now = self._clock()
        window = self._windows.setdefault(env_id, IdleWindow())
        observation = self._observations().get(sandbox_id)
        if observation is None:
            window.key = None  # IDLE-4: without fresh information from execd the window does not run
            return 0.0
        activity = observation.activity
        key = ActivityKey(activity.version, self._streams.version.get(env_id, 0))
        busy = activity.active > 0 or self._streams.open.get(env_id, 0) > 0
        if busy or key != window.key:
            window.key = None if busy else key
            window.since = now
            return 0.0
        return now - window.since
