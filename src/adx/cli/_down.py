"""``adx down``: stop for good what ``adx up`` started — its Environments (deleted or paused, asking first)
and then the cluster itself — found through the recorded cluster (``adx --cluster`` or the last ``adx up``).

Order: Environments first, through the API, while the cluster still runs (so the Coordinator's records say
what happened to them); then the ``adx up`` process is asked to stop (SIGTERM: it stops every daemon as Ctrl-C
does). With ``--delete``, sandboxes the API did not reach (other tenants' Environments) are removed last from
the host, like ``adx sandbox prune`` does for a removed state directory."""

from __future__ import annotations

import json
import os
import signal
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from adx.cli._app import GlobalOptions, app, console, err_console
from adx.cli._cluster import NO_CLUSTER_FIX, ClusterInfo, find_cluster
from adx.cli._output import failing
from adx.errors import AdxError, InvalidInputError, NotFoundError

#: ``adx up`` records its own process here (``<state_dir>/up.json``) while it runs.
UP_FILE = "up.json"
STOP_SECONDS = 120.0


class Action(StrEnum):
    DELETE = "delete"
    PAUSE = "pause"
    KEEP = "keep"


def up_pid(state_dir: Path) -> int | None:
    """The running ``adx up`` of ``state_dir`` (None when it is not running)."""
    try:
        data = json.loads((state_dir / UP_FILE).read_text())
        pid = int(data["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return pid if b"up" in cmdline else None  # a reused PID is not our `adx up`


def _choose(delete: bool, pause: bool, keep: bool, yes: bool) -> Action:
    chosen = [a for a, on in ((Action.DELETE, delete), (Action.PAUSE, pause), (Action.KEEP, keep)) if on]
    if len(chosen) > 1:
        raise InvalidInputError("--delete/--pause/--keep", "give only one of them")
    if chosen:
        return chosen[0]
    if yes:
        raise InvalidInputError("--delete/--pause/--keep", "with --yes, say what happens to the Environments")
    answer = typer.prompt("Environments: delete, pause or keep them?", default="keep")
    try:
        return Action(answer.strip().lower())
    except ValueError:
        raise InvalidInputError("answer", f"must be delete, pause or keep, got {answer!r}") from None


def _environments(cluster: ClusterInfo, action: Action, yes: bool) -> None:
    import adx

    with adx.Client(api_url=cluster.api_url, api_key=cluster.api_key()) as client:
        envs = [e for e in client.environments.list() if e.state.value not in ("deleted", "deleting")]
        if action is Action.PAUSE:
            envs = [e for e in envs if e.state.value == "running"]
        if not envs:
            console.print(f"no Environments to {action.value}")
            return
        console.print(f"{len(envs)} Environments of tenant {cluster.tenant} to {action.value}:", highlight=False)
        for env in envs:
            console.print(f"  {env.id}  {env.state.value}", highlight=False)
        if not yes and not typer.confirm(f"{action.value} them?", default=False):
            raise typer.Exit(1)
        for index, env in enumerate(envs, 1):
            console.print(f"[{index}/{len(envs)}] {action.value} {env.id} ...", highlight=False, end=" ")
            try:
                env.delete() if action is Action.DELETE else env.pause()
            except AdxError as exc:
                console.print("failed")
                err_console.print(f"  {exc.message}", highlight=False)
                continue
            console.print("done")
        if action is Action.DELETE:
            _wait_deleted(envs)


def _wait_deleted(envs: list[Any], within: float = 60.0) -> None:
    """A delete returns once queued: wait until the nodes confirm, so the stop cuts no cleanup short."""
    deadline = time.monotonic() + within
    for env in envs:
        while time.monotonic() < deadline:
            try:
                env.refresh()
            except NotFoundError:
                break
            if env.state.value == "deleted":
                break
            time.sleep(0.2)


def _stop_up(cluster: ClusterInfo) -> None:
    pid = up_pid(cluster.state_dir)
    if pid is None:
        console.print(f"`adx up --state-dir {cluster.state_dir}` is not running")
        return
    console.print(f"stopping `adx up` (pid {pid}) ...", highlight=False)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    while up_pid(cluster.state_dir) == pid:
        if time.monotonic() > deadline:
            err_console.print(f"adx: `adx up` (pid {pid}) did not stop within {STOP_SECONDS:g}s")
            raise typer.Exit(1)
        time.sleep(0.2)
    console.print("cluster stopped")


def _remove_left_sandboxes(cluster: ClusterInfo) -> int:
    """After the stop: every sandbox of this cluster's sandboxd still on the host (another tenant's)."""
    from adx.cli._prune_cmd import remove_all
    from adx.cli._up_cluster import cgroup_parent_name
    from adx.sandboxd._prune import find_orphans

    left = find_orphans([cgroup_parent_name(cluster.state_dir)], owned_by=str(cluster.state_dir / "sandboxd" / "data"))
    return remove_all(left)


def _unmount_storage_pool(cluster: ClusterInfo) -> None:
    """The btrfs pool of sandboxd's enforced disk is a loop mount that outlives sandboxd (a restart adopts it):
    with the cluster stopped and none of its sandboxes left, take it down. Its image file stays, with the local
    checkpoints of paused Environments in it; the next ``adx up`` mounts it again."""
    from adx.cli._up_cluster import cgroup_parent_name
    from adx.sandboxd._prune import find_orphans
    from adx.sandboxd._storage import mounted, pool_paths, unmount_pool

    data = cluster.state_dir / "sandboxd" / "data"
    mount = pool_paths(data)[1]
    if up_pid(cluster.state_dir) is not None or not mounted(mount):
        return
    if find_orphans([cgroup_parent_name(cluster.state_dir)], owned_by=str(data)):
        console.print(f"storage pool {mount} stays mounted: sandboxes of this cluster still use it", highlight=False)
        return
    try:
        unmount_pool(mount)
    except AdxError as exc:
        err_console.print(f"adx: could not unmount the storage pool {mount}: {exc.message}", highlight=False)
        return
    console.print(f"storage pool unmounted ({mount}; its image file keeps paused Environments)", highlight=False)


@app.command("down")
def down(
    delete: Annotated[bool, typer.Option("--delete", help="delete every Environment, then stop")] = False,
    pause: Annotated[bool, typer.Option("--pause", help="pause the running Environments, then stop")] = False,
    keep: Annotated[bool, typer.Option("--keep", help="leave them running (the next `adx up` adopts them)")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
) -> None:
    """Stop the `adx up` cluster and delete or pause its Environments."""
    with failing():
        cluster = find_cluster(GlobalOptions.cluster)
        if cluster is None:
            raise NotFoundError(f"no cluster is recorded: {NO_CLUSTER_FIX}")
        action = _choose(delete, pause, keep, yes)
        running = up_pid(cluster.state_dir) is not None
        if action is not Action.KEEP and running:
            _environments(cluster, action, yes)
        elif action is not Action.KEEP:
            console.print("the cluster is not running: its Environments cannot be reached through the API")
        _stop_up(cluster)
        failed = _remove_left_sandboxes(cluster) if action is Action.DELETE else 0
        _unmount_storage_pool(cluster)
    raise typer.Exit(1 if failed else 0)
