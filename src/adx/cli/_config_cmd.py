"""``adx config check``: validate a component's configuration file without starting anything."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from adx.cli._app import app, console
from adx.cli._components import COMPONENTS, load_component_config
from adx.cli._output import failing, print_json

config_app = typer.Typer(help="Inspect and validate configuration files.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("check")
def check(
    file: Annotated[Path, typer.Argument(help="TOML configuration file", dir_okay=False)],
    component: Annotated[
        str,
        typer.Option("--component", "-c", help=f"which component's schema: {', '.join(sorted(COMPONENTS))}"),
    ],
    show: Annotated[bool, typer.Option("--show", help="print the effective configuration as JSON")] = False,
) -> None:
    """Exit 0 if FILE (plus ADX_* environment overrides) is a valid configuration for COMPONENT."""
    with failing():
        config = load_component_config(component, file)
    if show:
        print_json(config.model_dump(mode="json"))
    else:
        console.print(f"{file}: valid {component} configuration", highlight=False, soft_wrap=True)


@config_app.command("reference")
def reference(
    component: Annotated[
        list[str] | None,
        typer.Option("--component", "-c", help=f"only these components: {', '.join(sorted(COMPONENTS))}"),
    ] = None,
) -> None:
    """Print every configuration key of every component (type, default, bounds, description) as Markdown."""
    from adx.cli._config_reference import configuration_reference

    with failing():
        text = configuration_reference(component)
    typer.echo(text, nl=False)
