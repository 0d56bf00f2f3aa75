"""``adx sandboxd``: process entry — lock, validate, initialise, reconcile, then serve (SBX-10 order)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import stat

from adx._fs import exclusive_lock
from adx.errors import ConflictError
from adx.sandboxd._cgroups import detect_layout
from adx.sandboxd._config import SandboxdConfig
from adx.sandboxd._http import ApiServer, Route
from adx.sandboxd._logs import LogGroupRequest, LogsRequest
from adx.sandboxd._models import (
    CheckpointRef,
    CheckpointRequest,
    CommitLayerRequest,
    CreateRequest,
    ListCheckpointsRequest,
    ReclaimRequest,
    RestoreRequest,
    SandboxRef,
    SetNetworkRequest,
    WaitRequest,
)
from adx.sandboxd._service import SandboxService

__all__ = ["run"]

log = logging.getLogger("adx.sandboxd")


def _prepare_state_dir(config: SandboxdConfig) -> None:
    path = config.state_dir
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if st.st_uid != os.getuid():
        raise ConflictError(f"state dir {path} is owned by uid {st.st_uid}, not {os.getuid()}")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)  # private: holds secret tokens and the ownership marker


def run(config: SandboxdConfig) -> int:
    """Run until SIGTERM/SIGINT. Sandboxes and their supervisors keep running after a normal stop (SBX-11)."""
    _prepare_state_dir(config)
    with exclusive_lock(config.state_dir / "daemon.lock", timeout=0, what="sandboxd daemon.lock (another sandboxd?)"):
        service = SandboxService(config, detect_layout())
        loaded = service.load()  # refuses corrupt/incompatible state before anything is written
        # Everything up to here is single-threaded: the spawner is exec'd from a thread-free process.
        service.start(loaded)
        asyncio.run(_serve(service, config))
    return 0


def _routes(service: SandboxService, config: SandboxdConfig) -> dict[str, Route]:
    t = config.request_timeout_seconds
    return {
        "Create": Route(CreateRequest, service.create, config.create_timeout_seconds + t, shield=True),
        "Get": Route(SandboxRef, service.get, t, shield=False),
        "Reclaim": Route(ReclaimRequest, service.reclaim, t, shield=True),
        "List": Route(None, lambda _: service.list(), t, shield=False),
        "Delete": Route(SandboxRef, service.delete, config.delete_timeout_seconds * 2 + t, shield=True),
        "Wait": Route(WaitRequest, service.wait, None, shield=False),
        "Stats": Route(SandboxRef, service.stats, t, shield=False),
        "Resource": Route(None, lambda _: service.resource(), t, shield=False),
        "Health": Route(None, lambda _: service.health(), t, shield=False),
        "Pause": Route(SandboxRef, service.pause, t, shield=True),
        "SetNetwork": Route(SetNetworkRequest, service.set_network, t, shield=True),
        "Resume": Route(SandboxRef, service.resume, t, shield=True),
        "Checkpoint": Route(CheckpointRequest, service.checkpoint, config.checkpoint_timeout_seconds + t, shield=True),
        "DeleteCheckpoint": Route(
            CheckpointRef, service.delete_checkpoint, config.checkpoint_timeout_seconds, shield=True
        ),
        "Restore": Route(RestoreRequest, service.restore, config.checkpoint_timeout_seconds + t, shield=True),
        "ListCheckpoints": Route(ListCheckpointsRequest, service.list_checkpoints, t, shield=False),
        # Logs bounds itself (wait_seconds <= 60); reads never change anything.
        "Logs": Route(LogsRequest, service.logs.read, 60 + t, shield=False),
        "ListLogs": Route(None, lambda _: service.logs.list(), t, shield=False),
        "DeleteLogs": Route(LogGroupRequest, service.logs.delete, t, shield=True),
        "CommitLayer": Route(
            CommitLayerRequest, service.commit_layer, config.checkpoint_timeout_seconds + t, shield=True
        ),
        "Output": Route(SandboxRef, service.output, t, shield=False),
    }


async def _serve(service: SandboxService, config: SandboxdConfig) -> None:
    await service.attach()
    await service.start_control()  # before the API: creates register their execd's control socket
    service.pin_default_shape()
    service.refill_warm_soon()  # in the background: creates are served meanwhile (cold until members are ready)
    server = ApiServer(config.api_socket, _routes(service, config), allowed_uid=os.getuid())
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    maintenance = asyncio.create_task(service.maintenance(), name="maintenance")
    log.info(
        "sandboxd ready",
        extra={
            "socket": str(config.api_socket),
            "runtime_control_socket": str(config.runtime_control_socket),
            "owner": service.owner,
            "sandboxes": len(service.records),
        },
    )
    try:
        await stop.wait()
    finally:
        log.info("sandboxd stopping; sandboxes keep running")
        await server.close()
        maintenance.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await maintenance
        await service.close()
