"""``adx sandbox prune``: remove sandboxes whose sandboxd state directory no longer exists (see
``adx.sandboxd._prune``: only a sandbox whose supervisor's lock names a removed state directory is touched)."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Annotated

import typer

from adx.cli._app import app, console, err_console

if TYPE_CHECKING:
    from adx.sandboxd._prune import Leftover

sandbox_app = typer.Typer(
    help="Sandboxes on this host, below the cluster: find and remove orphans.", no_args_is_help=True
)
app.add_typer(sandbox_app, name="sandbox")

#: Every cgroup parent sandboxd uses by default: its own default and one per `adx up` state directory.
PARENT_PREFIX = "adx-"


def default_parents() -> list[str]:
    """Each top-level ``adx-*`` cgroup directory and its direct subdirectories (a nested cgroup_parent)."""
    from adx.sandboxd._cgroups import detect_layout

    layout = detect_layout()
    roots = [layout.v2_root] if layout.v2_root else []
    roots += list(dict.fromkeys(layout.v1_mounts.values()))
    parents: set[str] = set()
    for root in roots:
        with contextlib.suppress(OSError):
            for top in os.scandir(root):
                if top.name.startswith(PARENT_PREFIX) and top.is_dir(follow_symlinks=False):
                    parents.add(top.name)
                    with contextlib.suppress(OSError):
                        parents.update(
                            f"{top.name}/{sub.name}"
                            for sub in os.scandir(top.path)
                            if sub.is_dir(follow_symlinks=False)
                        )
    return sorted(parents)


def prune_orphans(parents: list[str] | None, dry_run: bool, yes: bool) -> int:
    """List the orphans, then (unless ``dry_run``, and after asking unless ``yes``) remove them. Returns how
    many could not be removed completely."""
    from adx.sandboxd._prune import find_orphans

    orphans = find_orphans(parents or default_parents())
    if not orphans:
        console.print("no orphaned sandboxes on this host")
        return 0
    for o in orphans:
        extra = [f"cgroups {', '.join(o.cgroup_dirs)}"]
        if o.nft_table:
            extra.append(f"nftables table {o.nft_table}")
        if o.mounts:
            extra.append(f"mounts {', '.join(o.mounts)}")
        console.print(
            f"{o.sandbox_id}  state dir {o.state_dir} (removed); supervisor pid {o.supervisor}, "
            f"{len(o.processes)} processes, {len(o.helpers)} helpers; " + "; ".join(extra),
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
    if dry_run:
        console.print(f"{len(orphans)} orphaned sandboxes (dry run: nothing removed)")
        return 0
    if not yes and not typer.confirm(f"remove these {len(orphans)} sandboxes?", default=False):
        console.print("nothing removed")
        return 0
    return remove_all(orphans)


def remove_all(orphans: list[Leftover]) -> int:
    """Remove each, saying so; returns how many could not be removed completely."""
    from adx.sandboxd._prune import remove_orphan

    failed = 0
    for o in orphans:
        problems = remove_orphan(o)
        if problems:
            failed += 1
            err_console.print(f"{o.sandbox_id}: not fully removed: {'; '.join(problems)}", highlight=False)
        else:
            console.print(f"removed {o.sandbox_id}", highlight=False)
    return failed


@sandbox_app.command("prune")
def prune(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="only list what would be removed")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
    cgroup_parent: Annotated[
        list[str] | None,
        typer.Option("--cgroup-parent", help="look only under this cgroup parent (repeatable; default: every adx-*)"),
    ] = None,
) -> None:
    """Remove sandboxes (processes, cgroups, network tables, mounts) whose state directory no longer exists."""
    if os.geteuid() != 0:
        err_console.print("adx: `adx sandbox prune` needs root (it reads other processes' descriptors and cgroups)")
        raise typer.Exit(4)
    failed = prune_orphans(cgroup_parent, dry_run, yes)
    raise typer.Exit(1 if failed else 0)
