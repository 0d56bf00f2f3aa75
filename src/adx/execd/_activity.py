"""Client activity and the admission gate (IDLE-2, IDLE-3, IDLE-6).

Everything here runs on the event loop thread, so each method is atomic with respect to the others: that is
what makes ``close_admission(expected_version)`` a compare-and-close with no lock.
"""

from __future__ import annotations

from collections.abc import Callable

from adx.execd._protocol import ActivityState

__all__ = ["Activity", "AdmissionClosed"]


class AdmissionClosed(Exception):
    """A client operation arrived while admission is closed (the Environment is being paused)."""


class Activity:
    """``active``: client operations in progress; ``version``: bumped whenever activity starts or ends.

    Client operations bump the version when they start and when they end. Background commands bump it when
    they start and when they exit and are counted in ``background_running``, but a background command alone
    never counts as an active client operation (IDLE-3): once its client has gone it does not block reclaim.
    Control operations (admission, health, reporting) never touch the version.
    """

    def __init__(self) -> None:
        self.version = 0
        self.active = 0
        self.background_running = 0
        self.admission_open = True
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs synchronously after every change (it should only schedule work)."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    def _count(self, active: int = 0, background: int = 0) -> None:
        # Every change of demand bumps the version: that is what close_admission's compare sees.
        self.active += active
        self.background_running += background
        self.version += 1
        self._changed()

    def begin(self) -> None:
        """Admit one client operation or raise :class:`AdmissionClosed`."""
        if not self.admission_open:
            raise AdmissionClosed
        self._count(active=1)

    def end(self) -> None:
        self._count(active=-1)

    def background_started(self) -> None:
        self._count(background=1)

    def background_exited(self) -> None:
        self._count(background=-1)

    def close_admission(self, expected_version: int) -> bool:
        """Close admission iff the version is still ``expected_version``; otherwise change nothing.

        Operations admitted before the close keep running and finish normally; their end still bumps the
        version, which is how the caller's re-check sees demand that was already in flight.
        """
        if self.version != expected_version:
            return False
        if self.admission_open:
            self.admission_open = False
            self._changed()
        return True

    def open_admission(self) -> None:
        if not self.admission_open:
            self.admission_open = True
            self._changed()

    def snapshot(self) -> ActivityState:
        return {
            "version": self.version,
            "active": self.active,
            "backgroundRunning": self.background_running,
            "admissionOpen": self.admission_open,
        }
