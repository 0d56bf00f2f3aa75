"""``adx image build|import|list|rm|base|init``: the node's image store (docs/images.md).

Which node: ``--config`` (sandboxd's TOML: its socket and images dir), else the cluster ``adx up`` recorded
(``--cluster`` / ``$ADX_CLUSTER``): its sandboxd. ``build`` needs that sandboxd running (each RUN step is one of
its sandboxes); ``list``, ``rm`` and ``base`` work on the store directly.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from adx.cli._app import app, console, fail
from adx.cli._output import failing
from adx.config import load_model
from adx.errors import AdxError, InvalidInputError
from adx.sandboxd import SandboxdConfig

if TYPE_CHECKING:
    from adx.images import ImageStore
    from adx.sandboxd._image_build import StepEvent

image_app = typer.Typer(help="Sandbox images: build from a Dockerfile, list, remove.", no_args_is_help=True)
app.add_typer(image_app, name="image")

_CONFIG = typer.Option("--config", help="sandboxd TOML configuration (default: the cluster adx up recorded)")
_CLUSTER = typer.Option("--cluster", help="state directory or cluster file of an `adx up` cluster")


def _sandboxd_config(config: Path | None, cluster: str | None) -> SandboxdConfig:
    if config is not None:
        return load_model(SandboxdConfig, "sandboxd", config)
    from adx.cli._cluster import find_cluster

    found = find_cluster(cluster)
    if found is None:
        return load_model(SandboxdConfig, "sandboxd", None)  # the packaged defaults (/var/lib/adx/sandboxd)
    # Where `adx up` puts its sandboxd (cli/_up_cluster.py).
    return SandboxdConfig(
        state_dir=found.state_dir / "sandboxd" / "data",
        socket_path=found.state_dir / "sandboxd" / "api" / "sandboxd.sock",
    )


def _store(cfg: SandboxdConfig) -> ImageStore:
    from adx.images import ImageStore

    return ImageStore(cfg.images_root / "store").ensure()


def _open_store(config: Path | None, cluster: str | None) -> ImageStore:
    with failing():
        return _store(_sandboxd_config(config, cluster))


def _build_args(values: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, eq, arg = value.partition("=")
        if not eq or not name:
            raise InvalidInputError("--build-arg", f"{value!r} is not NAME=VALUE")
        out[name] = arg
    return out


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


@image_app.command("build")
def image_build(
    name: Annotated[str, typer.Argument(help="image name (1-63 of a-z 0-9 . _ -)")],
    file: Annotated[Path, typer.Option("-f", "--file", help="the Dockerfile", dir_okay=False, exists=True)] = Path(
        "Dockerfile"
    ),
    context: Annotated[Path | None, typer.Option("--context", help="COPY sources (default: the file's dir)")] = None,
    build_arg: Annotated[list[str] | None, typer.Option("--build-arg", help="NAME=VALUE for an ARG")] = None,
    network: Annotated[str | None, typer.Option("--network", help="RUN steps' network: none or veth")] = None,
    config: Annotated[Path | None, _CONFIG] = None,
    cluster: Annotated[str | None, _CLUSTER] = None,
) -> None:
    """Build NAME from a Dockerfile (FROM RUN COPY ENV WORKDIR USER ARG); unchanged steps come from the cache."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from adx.sandboxd import SandboxdClient
    from adx.sandboxd._image_build import build_image

    try:
        cfg = _sandboxd_config(config, cluster)
        args = _build_args(build_arg or [])
        if network not in (None, "none", "veth"):
            raise InvalidInputError("--network", "must be none or veth")
        store = _store(cfg)
        text = file.read_text()
    except (AdxError, OSError) as exc:
        fail(exc if isinstance(exc, AdxError) else InvalidInputError("--file", str(exc)))
    t0 = time.monotonic()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=Console()) as bar:
        task = bar.add_task("starting", total=None)

        def on_step(e: StepEvent) -> None:
            label = f"[{e.index}/{e.total}] {e.text[:90]}"
            if e.status == "running":
                bar.update(task, description=f"{label}  [yellow]running[/yellow]")
                return
            mark = {"built": "[green]built[/green]", "cached": "[cyan]cached[/cyan]", "config": "[dim]config[/dim]"}
            bar.console.print(f"{label}  {mark[e.status]}  {e.seconds:.1f}s", highlight=False, soft_wrap=True)

        def on_base(line: str) -> None:
            bar.update(task, description=f"base image: {line[:100]}")

        async def go() -> object:
            async with SandboxdClient(cfg.api_socket) as client:
                return await build_image(
                    client,
                    store,
                    text,
                    name,
                    context=context or file.parent,
                    build_args=args,
                    network=network,
                    progress=on_step,
                    base_progress=on_base,
                )

        try:
            result = asyncio.run(go())
        except AdxError as exc:
            bar.stop()
            fail(exc)
    from adx.sandboxd._image_build import BuildResult

    assert isinstance(result, BuildResult)
    console.print(
        f"image {name}: {len(result.manifest.layers)} layers, {result.built} steps built, {result.cached} cached, "
        f"{time.monotonic() - t0:.1f}s",
        highlight=False,
    )


@image_app.command("list")
def image_list(
    config: Annotated[Path | None, _CONFIG] = None,
    cluster: Annotated[str | None, _CLUSTER] = None,
) -> None:
    """The images of the node's store (name, layers, size, user, workdir)."""
    from rich.table import Table

    store = _open_store(config, cluster)
    table = Table("NAME", "LAYERS", "SIZE", "USER", "WORKDIR", "CREATED")
    for m in store.list_images():
        size = sum(store.layer_info(d).size_bytes for d in m.layers if store.has_layer(d))
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(m.created_at))
        table.add_row(m.name, str(len(m.layers)), _size(size), m.user, m.workdir, created)
    console.print(table)


@image_app.command("rm")
def image_rm(
    name: Annotated[str, typer.Argument(help="image name")],
    force: Annotated[bool, typer.Option("--force", help="remove the name even while sandboxes use it")] = False,
    config: Annotated[Path | None, _CONFIG] = None,
    cluster: Annotated[str | None, _CLUSTER] = None,
) -> None:
    """Remove an image; layers no other image or live sandbox uses are deleted."""
    store = _open_store(config, cluster)
    with failing():
        removed = store.rm(name, force=force)
    console.print(f"removed image {name} ({len(removed)} unused layers deleted)", highlight=False)


@image_app.command("base")
def image_base(
    name: Annotated[str, typer.Argument(help="name of the image to make")] = "debian",
    npm_registry: Annotated[
        str | None,
        typer.Option(
            "--npm-registry",
            help="npm registry (or mirror) node and npm are fetched from; default $ADX_NPM_REGISTRY, else "
            "https://registry.npmjs.org",
        ),
    ] = None,
    config: Annotated[Path | None, _CONFIG] = None,
    cluster: Annotated[str | None, _CLUSTER] = None,
) -> None:
    """Build the Debian base image (bookworm, mmdebstrap) unless the store has it; minutes the first time."""
    from adx.images import ensure_debian_image

    store = _open_store(config, cluster)
    t0 = time.monotonic()
    with failing(), console.status("building the Debian base image ...") as status:
        manifest, built = ensure_debian_image(
            store, name, npm_registry=npm_registry, progress=lambda line: status.update(line[:110])
        )
    how = f"built in {time.monotonic() - t0:.0f}s" if built else "already in the store"
    console.print(f"image {manifest.name}: {how}", highlight=False)


@image_app.command("import")
def image_import(
    source: Annotated[Path, typer.Argument(help="OCI layout (dir or tar) or `docker save` tarball", exists=True)],
    name: Annotated[str, typer.Argument(help="image name")],
    config: Annotated[Path | None, _CONFIG] = None,
    cluster: Annotated[str | None, _CLUSTER] = None,
) -> None:
    """Import an OCI layout or a `docker save` tarball as NAME (its layers, Env, WorkingDir and User)."""
    from adx.images._import import import_image

    store = _open_store(config, cluster)
    t0 = time.monotonic()
    with failing():
        manifest = import_image(store, source, name, progress=lambda line: console.print(line, highlight=False))
    console.print(
        f"image {manifest.name}: {len(manifest.layers)} layers, user {manifest.user}, workdir {manifest.workdir}, "
        f"{time.monotonic() - t0:.1f}s",
        highlight=False,
    )


@image_app.command("init")
def image_init(config: Annotated[Path | None, _CONFIG] = None) -> None:
    """Build the host-derived default image once (sandboxd also builds it at start when missing); prints its path."""
    from adx.sandboxd._image import ensure_default_image

    with failing():
        cfg = load_model(SandboxdConfig, "sandboxd", config)
    path = ensure_default_image(cfg.images_root)
    console.print(str(path), highlight=False)
