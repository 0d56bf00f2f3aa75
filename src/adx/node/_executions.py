"""The node's record of its executions: what it needs to address them again after a restart.

One JSON file per execution (it holds the sandbox's secret token: mode 0600 in a 0700 directory), written
atomically. It is a cache of addressing data, not a catalog: ownership always comes from the Coordinator. An
execution is recorded before it is started (its planned address, without execd's socket) and again once it
runs, so a node that stops mid-start can still find and clean what the start left.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from adx._fs import atomic_write_json, fsync_dir
from adx.runtime import Execution


class ExecutionFiles:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _path(self, execution_id: str) -> Path:
        return self.directory / f"{execution_id}.json"

    def save(self, execution: Execution) -> None:
        atomic_write_json(
            self._path(execution.execution_id),
            {
                "env_id": execution.env_id,
                "generation": execution.generation,
                "execution_id": execution.execution_id,
                "native": execution.native,
                "execd_socket": str(execution.execd_socket) if execution.execd_socket else None,
                "started_at": execution.started_at,
            },
        )

    def forget(self, execution_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(execution_id).unlink()
            fsync_dir(self.directory)

    def load_all(self) -> list[Execution]:
        return [self._read(path) for path in sorted(self.directory.glob("*.json"))]

    def get(self, execution_id: str) -> Execution | None:
        path = self._path(execution_id)
        return self._read(path) if path.exists() else None

    @staticmethod
    def _read(path: Path) -> Execution:
        data = json.loads(path.read_text())
        return Execution(
            env_id=data["env_id"],
            generation=data["generation"],
            execution_id=data["execution_id"],
            native=data["native"],
            execd_socket=Path(data["execd_socket"]) if data["execd_socket"] else None,
            started_at=data["started_at"],
        )
