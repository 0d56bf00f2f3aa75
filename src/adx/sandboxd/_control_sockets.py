"""Runtime control (CTL-2/3): the node-level subscription socket and one control socket per execd sandbox."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from adx.sandboxd._cgroups import CpuPhase
from adx.sandboxd._control_hub import ControlHub
from adx.sandboxd._sandbox_layout import CONTROL_DIR, CONTROL_SOCKET
from adx.sandboxd._states import State
from adx.sandboxd._table import SandboxTable

__all__ = ["ControlSockets"]

log = logging.getLogger("adx.sandboxd")


class ControlSockets(SandboxTable):
    """The hub and the per-sandbox control sockets execd connects to (only the sandbox's PID 1 may report)."""

    _boost_tasks: set[asyncio.Future[None]]

    async def start_control(self) -> None:
        """Runtime control (CTL-2/3): the node-level subscription socket, then one control socket per execd
        sandbox that may still run, so execds that outlived a sandboxd restart reconnect."""
        self._boost_tasks = set()
        path = self.config.runtime_control_socket
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path.parent, 0o700)
        self.hub = ControlHub(path, allowed_uid=os.getuid(), verify_execd=self._is_init_of, on_ready=self._end_boost)
        await self.hub.start()
        for rec in list(self.records.values()):
            if rec.execd is not None and rec.state in (State.RUNNING, State.PAUSED, State.CREATING):
                try:
                    await self._register_control(rec.sandbox_id)
                except OSError as exc:
                    self._defer(f"runtime control socket of {rec.sandbox_id}: {exc}")

    def _end_boost(self, sandbox_id: str) -> None:
        """execd reported Ready: its start-up is over, the sandbox gets its CPU quota now (``_cgroups.CpuPhase``;
        its supervisor would at the boost's bound). In a thread, the Ready delta is not held for it."""
        rec = self.records.get(sandbox_id)
        if rec is None:
            return
        cgroup, cpu_millis = self._cgroup(sandbox_id), rec.resources.cpu_millis

        def limit() -> None:
            try:
                cgroup.set_cpu(CpuPhase.LIMITED, cpu_millis)
            except OSError as exc:  # deleted meanwhile; else the supervisor's bound still ends the boost
                log.info("ending the start-up boost at Ready failed: %s", exc, extra={"sandbox_id": sandbox_id})

        task = asyncio.ensure_future(asyncio.to_thread(limit))
        self._boost_tasks.add(task)
        task.add_done_callback(self._boost_tasks.discard)

    def _is_init_of(self, sandbox_id: str, pid: int) -> bool:
        """Only the sandbox's PID 1 (execd) may report for it: a workload process inside could otherwise
        connect to the control socket, impersonate execd and kick its connection off."""
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cgroups = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if len(nspid) < 2 or nspid[-1] != "1":
            return False
        own = f"/{self.config.cgroup_parent}/{self._native_name(sandbox_id)}"  # a claimed member keeps its cgroup
        return any(line.rpartition(":")[2] == own for line in cgroups.splitlines())

    async def _register_control(self, sandbox_id: str) -> None:
        if self.hub is not None and not self.hub.registered(sandbox_id):
            sdir = self.registry.sandbox_dir(sandbox_id)
            await self.hub.add_sandbox(sandbox_id, sdir / CONTROL_DIR / CONTROL_SOCKET)
