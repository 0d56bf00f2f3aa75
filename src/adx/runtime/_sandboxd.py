"""The sandboxd RuntimeDriver: each execution is one sandbox whose PID 1 is execd.

The driver asks for execd with ``CreateRequest.execd``; sandboxd builds execd's command line, mounts its own
execd runtime read-only at ``/opt/adx`` and binds execd's client and admin sockets at host-only paths
(``SandboxInfo.execd_socket`` / ``execd_admin_socket``, never reachable from inside the sandbox) whose
listening descriptors it hands to PID 1. The Relay and the readiness check connect to ``execd_socket``.

Runtime control (Ready, probe failures, activity, checkpoint requests) is served by sandboxd on ONE node-level
subscription, ``Health.runtime_control_socket``; :class:`adx.sandboxd.RuntimeControlSubscription` is its
client. ``ExecdReadiness`` still polls execd's health route; the node may take Ready from the subscription.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from adx._fs import ShortUnixPath
from adx.errors import AdxError, InvalidInputError, NotFoundError, UnavailableError, VersionMismatchError
from adx.model import NODE_IMAGES, NetworkPolicy, Resources, volume_data_dir
from adx.runtime._driver import (
    Artifact,
    DriverCapabilities,
    Execution,
    ExecutionSpec,
    ExecutionState,
    ExecutionStats,
    ExitInfo,
    InventoryItem,
)
from adx.sandboxd import (
    CreateRequest,
    CreateResponse,
    ExecdOptions,
    LogsRequest,
    LogsResponse,
    ProbeOptions,
    ReclaimRequest,
    ResourcesSpec,
    RestoreRequest,
    RuntimeControlSubscription,
    SandboxdClient,
    SandboxRef,
    SetNetworkRequest,
    ref_of,
)
from adx.sandboxd._models import SandboxInfo
from adx.sandboxd._states import State

META_ENV = "adx.env"
META_EXECUTION = "adx.execution"

_NATIVE_STATE = {
    State.CREATING: ExecutionState.RUNNING,
    State.RUNNING: ExecutionState.RUNNING,
    State.PAUSED: ExecutionState.PAUSED,
    State.TERMINATED: ExecutionState.EXITED,
    State.FAILED: ExecutionState.EXITED,
    State.STOPPING: ExecutionState.EXITED,
    State.DELETED: ExecutionState.MISSING,
}


def _ref(execution: Execution) -> SandboxRef:
    return SandboxRef.model_validate(execution.native)


def _exit_info(info: SandboxInfo) -> ExitInfo:
    status = info.exit
    if status is None:
        return ExitInfo(reason=info.reason or f"sandbox {info.state.value}")
    return ExitInfo(
        exit_code=status.exit_code,
        signal=status.signal,
        oom_killed=status.oom_killed,
        reason=info.reason or ("" if status.known else "ended without a recorded status"),
    )


class SandboxdDriver:
    name = "sandboxd"

    def __init__(
        self, socket: Path, *, python: str = "python3", call_timeout: float = 30.0, volumes_dir: Path | None = None
    ) -> None:
        self.client = SandboxdClient(socket, timeout=call_timeout)
        self.python = python
        self.volumes_dir = volumes_dir
        #: Makes a named image present in sandboxd's store before a start or restore mounts it (the node pulls
        #: it from another node, issue 13); None: the store has what it has.
        self.ensure_image: Callable[[str], Awaitable[object]] | None = None

    async def aclose(self) -> None:
        await self.client.aclose()

    async def health(self) -> None:
        health = await self.client.health()
        if not health.ok:
            raise UnavailableError(f"sandboxd is not healthy (storage_failed={health.storage_failed})")

    def capabilities(self) -> DriverCapabilities:
        return DriverCapabilities(checkpoint_kinds=frozenset({"filesystem"}), network_isolation=True)

    def _placement(self, spec: ExecutionSpec) -> dict[str, Any]:
        """What every sandbox of an execution carries: its identity, environment, limits and metadata."""
        env_spec = spec.spec
        return {
            "request_id": spec.execution_id,
            "sandbox_id": spec.execution_id,
            "generation": spec.generation,
            "token": spec.secret,
            "env": dict(env_spec.env),
            "resources": ResourcesSpec(
                cpu_millis=max(env_spec.resources.cpu_millis, 10),
                memory_bytes=max(env_spec.resources.memory_bytes, 8 << 20),
                # Exactly what placement reserved: no disk asked is no disk reserved (RES-6), never sandboxd's
                # default, which the Coordinator cannot count (it placed ~250 such starts past sandboxd's room).
                disk_bytes=env_spec.resources.disk_bytes,
            ),
            "metadata": {META_ENV: spec.env_id, META_EXECUTION: spec.execution_id},
            # None: the node's default (sandboxd's defaults.network / defaults.network_policy).
            "network_policy": env_spec.network,
            # Every execution of the Environment writes to one log group: restarts and resumes continue it.
            "log_group": spec.env_id,
            "volumes": self._volumes(spec),
        }

    def _volumes(self, spec: ExecutionSpec) -> dict[str, str]:
        """The tenant's volumes as sandboxd binds them (mount point -> host dir): at every start and restore, so
        a resumed or restarted execution mounts them again."""
        mounts = spec.spec.volumes
        if not mounts:
            return {}
        if self.volumes_dir is None:
            raise InvalidInputError("volumes", "this node has no volumes_dir configured: it cannot mount volumes")
        return {m.path: str(volume_data_dir(self.volumes_dir, spec.tenant, m.name)) for m in mounts}

    async def _check_volumes(self, spec: ExecutionSpec) -> None:
        """A volume whose directory is missing here (deleted meanwhile, or a volume root this node does not
        share) fails the start with that reason; sandboxd would fail it too, as a spawn failure the node retries
        under the same execution ID until the ID's reuse is refused, which hides the reason."""
        binds = self._volumes(spec)
        present = await asyncio.to_thread(lambda: [os.path.isdir(host) for host in binds.values()])
        for i, (mount, ok) in enumerate(zip(spec.spec.volumes, present, strict=True)):
            if not ok:
                raise InvalidInputError(
                    f"volumes[{i}].name",
                    f"volume {mount.name!r} has no directory on this node ({binds[mount.path]}): deleted, or "
                    "this node does not share the volume root",
                )

    @staticmethod
    def _execution(spec: ExecutionSpec, created: CreateResponse) -> Execution:
        ref = ref_of(created)
        if created.sandbox.execd_socket is None:
            raise UnavailableError(f"sandboxd created {ref.sandbox_id} without execd's socket (an older sandboxd?)")
        return Execution(
            env_id=spec.env_id,
            generation=spec.generation,
            execution_id=spec.execution_id,
            native=ref.model_dump(),
            execd_socket=Path(created.sandbox.execd_socket),
            started_at=time.time(),
        )

    def _execd(self, spec: ExecutionSpec) -> ExecdOptions:
        probe = spec.spec.lifecycle.health_probe
        return ExecdOptions(
            python=self.python,
            execution_id=spec.execution_id,
            probe=ProbeOptions.model_validate(probe.model_dump()) if probe is not None else None,
        )

    def planned(self, spec: ExecutionSpec) -> Execution:
        ref = SandboxRef(sandbox_id=spec.execution_id, generation=spec.generation, token=spec.secret)
        return Execution(spec.env_id, spec.generation, spec.execution_id, native=ref.model_dump())

    async def _ensure_image(self, spec: ExecutionSpec) -> None:
        if spec.spec.image not in NODE_IMAGES and self.ensure_image is not None:
            await self.ensure_image(spec.spec.image)

    async def start(self, spec: ExecutionSpec) -> Execution:
        await self._check_volumes(spec)
        await self._ensure_image(spec)
        request = CreateRequest(
            argv=list(spec.spec.entrypoint or []),  # execd's workload (none: execd alone keeps it running)
            execd=self._execd(spec),
            image=spec.spec.image,  # a restore mounts the layers its checkpoint recorded instead
            **self._placement(spec),
        )
        return self._execution(spec, await self.client.create(request))

    async def restore(self, spec: ExecutionSpec, location: str, digest: str) -> Execution:
        await self._check_volumes(spec)
        await self._ensure_image(spec)
        request = RestoreRequest(
            location=location,
            digest=digest,
            argv=list(spec.spec.entrypoint or []),
            execd=self._execd(spec),
            **self._placement(spec),
        )
        return self._execution(spec, await self.client.restore(request))

    async def checkpoint(self, execution: Execution, storage: str, within_seconds: float) -> Artifact:
        ref = _ref(execution)
        # Freeze first, then capture the frozen sandbox: on a failed capture it is thawed and runs on unharmed.
        await self.client.pause(ref)
        try:
            info = await self.client.checkpoint(ref, storage=storage, leave_running=True, call_timeout=within_seconds)
        except BaseException:
            with contextlib.suppress(AdxError):
                await self.client.resume(ref)
            raise
        return Artifact(info.checkpoint_id, info.location, info.digest, info.size_bytes, info.created_at)

    async def thaw(self, execution: Execution) -> None:
        await self.client.resume(_ref(execution))

    async def delete_checkpoint(self, location: str, digest: str) -> None:
        await self.client.delete_checkpoint(location, digest)

    async def stats(self, execution: Execution) -> ExecutionStats:
        reading = await self.client.stats(_ref(execution))
        return ExecutionStats(
            cpu_usage_seconds=reading.cpu_usage_ns / 1e9,
            memory_bytes=reading.memory_bytes,
            memory_peak_bytes=reading.memory_peak_bytes,
            memory_cache_bytes=reading.memory_cache_bytes,
            disk_bytes=reading.disk_bytes,
            pids=reading.pids,
            oom_kills=reading.oom_kills,
            observed_at=reading.observed_at,
        )

    async def checkpoint_roots(self) -> dict[str, str]:
        return (await self.client.health()).artifact_roots

    async def list_checkpoints(self, storage: str) -> list[Artifact]:
        listing = await self.client.list_checkpoints(storage)
        return [
            Artifact(c.checkpoint_id, c.location, c.digest, c.size_bytes, c.created_at) for c in listing.checkpoints
        ]

    async def observe(self, execution: Execution) -> ExecutionState:
        try:
            info = await self.client.get(_ref(execution))
        except NotFoundError:
            return ExecutionState.MISSING
        except AdxError:
            return ExecutionState.UNKNOWN
        return _NATIVE_STATE.get(info.state, ExecutionState.UNKNOWN)

    async def wait_exit(self, execution: Execution) -> ExitInfo:
        while True:
            done = await self.client.wait(_ref(execution), timeout_seconds=3600)
            if done.done:
                return _exit_info(done.sandbox)

    async def stop(self, execution: Execution) -> None:
        await self.client.delete(_ref(execution))

    async def inventory(self) -> list[InventoryItem]:
        items = []
        for info in await self.client.list():
            execution_id = info.metadata.get(META_EXECUTION)
            env_id = info.metadata.get(META_ENV)
            if execution_id is None or env_id is None:
                continue
            native: dict[str, Any] = {"sandbox_id": info.sandbox_id, "generation": info.generation, "owner": info.owner}
            items.append(
                InventoryItem(
                    execution_id, env_id, info.generation, _NATIVE_STATE.get(info.state, ExecutionState.UNKNOWN), native
                )
            )
        return items

    async def reclaim(self, item: InventoryItem, secret: str) -> Execution:
        """sandboxd's Reclaim: the sandbox of ``item`` gets the token ``secret`` (see RuntimeDriver.reclaim).

        The owner named is the one ``inventory`` listed the sandbox under (else sandboxd's current one): a
        sandboxd whose state was replaced meanwhile refuses it.
        """
        sandbox_id = str(item.native.get("sandbox_id", item.execution_id))
        owner = item.native.get("owner")
        if not isinstance(owner, str):
            owner = (await self.client.health()).owner
        try:
            request = ReclaimRequest(owner=owner, sandbox_id=sandbox_id, generation=item.generation, token=secret)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise InvalidInputError("secret" if field == "token" else field, err["msg"]) from None
        reclaimed = await self.client.reclaim(request)
        info = reclaimed.sandbox
        return Execution(
            env_id=item.env_id,
            generation=info.generation,
            execution_id=item.execution_id,
            native=ref_of(reclaimed).model_dump(),
            execd_socket=Path(info.execd_socket) if info.execd_socket is not None else None,
            started_at=info.created_at,
        )

    async def set_network(self, execution: Execution, policy: NetworkPolicy) -> None:
        await self.client.set_network(SetNetworkRequest(**_ref(execution).model_dump(), policy=policy))

    async def network_namespace(self, execution: Execution) -> Path:
        info = await self.client.get(_ref(execution))
        if info.native is None:
            raise UnavailableError(f"sandbox {info.sandbox_id} has no native identity yet")
        pid = await asyncio.to_thread(_namespace_init_pid, Path(info.native.cgroup_dir))
        if pid is None:
            raise NotFoundError(f"sandbox {info.sandbox_id} has no running init process")
        return Path(f"/proc/{pid}/ns/net")

    async def subscribe(self) -> RuntimeControlSubscription:
        """sandboxd's node-level runtime-control subscription (started; it reconnects by itself)."""
        path = (await self.client.health()).runtime_control_socket
        if path is None:
            raise UnavailableError("sandboxd serves no runtime-control subscription (an older sandboxd?)")
        subscription = RuntimeControlSubscription(path)
        subscription.start()
        return subscription

    async def resources(self) -> Resources:
        return (await self.resources_and_devices())[0]

    async def resources_and_devices(self) -> tuple[Resources, tuple[str, ...]]:
        """RES-2: one Resource call: the capacity sandboxd admits sandboxes against, and whole-device IDs.

        That capacity (its ``[capacity]`` config, else the host's CPU cores as millicores, memory and the state
        filesystem's size) is the one rule: placement then refuses what sandboxd would refuse. The host's free
        storage is not it: sandboxd counts reservations against its capacity, and free space moves with what
        sandboxes write (disk pressure, RES-7, watches that)."""
        info = await self.client.resource()
        capacity = Resources(
            cpu_millis=info.capacity.cpu_millis,
            memory_bytes=info.capacity.memory_bytes,
            disk_bytes=info.capacity.disk_bytes,
        )
        return capacity, tuple(info.device_ids)

    async def logs(self, request: LogsRequest) -> LogsResponse:
        """Workload output of a log group (an Environment's ID: every execution of it)."""
        return await self.client.logs(request)

    async def log_groups(self) -> list[str]:
        """The log groups the runtime keeps (MET-5 reclaims those of Environments the node no longer knows)."""
        return [g.group for g in (await self.client.list_logs()).groups]

    async def delete_logs(self, group: str) -> None:
        """Remove a log group (idempotent: a missing one counts as removed)."""
        with contextlib.suppress(NotFoundError):
            await self.client.delete_logs(group)

    async def storage(self) -> SandboxdStorage:
        """Where sandboxd keeps images and sandbox data: one health call names both."""
        health = await self.client.health()
        return SandboxdStorage(
            image_store=Path(health.image_store) if health.image_store else None,
            state_dir=Path(health.state_dir) if health.state_dir else None,
        )


@dataclass(frozen=True)
class SandboxdStorage:
    """sandboxd's image store (images pulled from peers land there) and state directory (where sandbox data
    lives: disk pressure is measured on its filesystem), as its health names them; None from a sandboxd too old
    to say."""

    image_store: Path | None
    state_dir: Path | None


def _namespace_init_pid(cgroup_dir: Path) -> int | None:
    """The host PID of the sandbox's PID 1 (its ``NSpid`` ends in 1), among the cgroup's processes."""
    try:
        pids = (cgroup_dir / "cgroup.procs").read_text().split()
    except OSError:
        return None
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if nspid and nspid[-1] == "1":
            return int(pid)
    return None


class ExecdReadiness:
    """Ready = execd answers its health route on its host-only socket.

    :class:`SubscriptionReadiness` takes Ready from sandboxd's runtime-control subscription instead (pushed);
    the node can switch to it with ``SubscriptionReadiness(driver, await driver.subscribe())``.

    An execution that exits meanwhile (e.g. a workload that cannot start) fails readiness at once.
    """

    def __init__(self, driver: SandboxdDriver, check_exit_every: float = 0.25) -> None:
        self.driver = driver
        self.check_exit_every = check_exit_every

    async def wait_ready(self, execution: Execution, within_seconds: float) -> None:
        if execution.execd_socket is None:
            return
        deadline = time.monotonic() + within_seconds
        with ShortUnixPath(execution.execd_socket) as socket_path:
            await self._poll(execution, socket_path, deadline, within_seconds)

    async def _poll(self, execution: Execution, socket_path: str, deadline: float, within_seconds: float) -> None:
        next_exit_check = time.monotonic() + self.check_exit_every
        transport = httpx.AsyncHTTPTransport(uds=socket_path)
        async with httpx.AsyncClient(transport=transport, base_url="http://execd", timeout=2.0) as client:
            last = "no answer yet"
            while time.monotonic() < deadline:
                try:
                    response = await client.get("/v1/health")
                    if response.status_code == 200:
                        return
                    last = f"health answered {response.status_code}"
                except httpx.HTTPError as exc:
                    last = str(exc) or type(exc).__name__
                if time.monotonic() >= next_exit_check:
                    next_exit_check = time.monotonic() + self.check_exit_every
                    if await self.driver.observe(execution) in (ExecutionState.EXITED, ExecutionState.MISSING):
                        ended = _exit_info(await self.driver.client.get(_ref(execution))).describe()
                        raise UnavailableError(f"execution {execution.execution_id} ended before it was ready: {ended}")
                await asyncio.sleep(0.01)
        raise UnavailableError(f"execd of {execution.execution_id} not ready within {within_seconds}s: {last}")


class SubscriptionReadiness:
    """Ready = execd reported Ready on sandboxd's runtime-control subscription (pushed, no polling).

    Same contract as :class:`ExecdReadiness`; an execution that exits meanwhile fails at once. With a probe,
    Ready means the workload answered once; probe failures before that are in the message.
    """

    def __init__(
        self, driver: SandboxdDriver, subscription: RuntimeControlSubscription, check_exit_every: float = 0.25
    ) -> None:
        self.driver = driver
        self.subscription = subscription
        self.check_exit_every = check_exit_every

    async def wait_ready(self, execution: Execution, within_seconds: float) -> None:
        sandbox_id = str(execution.native["sandbox_id"])
        deadline = time.monotonic() + within_seconds

        def is_ready(states: dict[str, Any]) -> bool:
            state = states.get(sandbox_id)
            return state is not None and (bool(state.ready) or state.refused is not None)

        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                state = self.subscription.states.get(sandbox_id)
                probe = state.probe if state is not None else None
                why = (
                    f"probe failing ({probe.consecutive_failures}x: {probe.reason})"
                    if probe is not None and not probe.ok
                    else ("execd connected, not ready" if state is not None else "no report from execd")
                )
                raise UnavailableError(f"execd of {execution.execution_id} not ready within {within_seconds}s: {why}")
            if await self.subscription.wait_until(is_ready, min(remaining, self.check_exit_every)):
                refused = self.subscription.states[sandbox_id].refused
                if refused is not None:
                    raise VersionMismatchError(f"execution {execution.execution_id} cannot be served: {refused}")
                return
            if await self.driver.observe(execution) in (ExecutionState.EXITED, ExecutionState.MISSING):
                ended = _exit_info(await self.driver.client.get(_ref(execution))).describe()
                raise UnavailableError(f"execution {execution.execution_id} ended before it was ready: {ended}")
