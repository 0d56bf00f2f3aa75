"""docs/configuration.md is the generated reference of every component's configuration, and stays current."""

from __future__ import annotations

import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from adx.cli._components import COMPONENTS, component_model
from adx.cli._config_reference import configuration_reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_checked_in_reference_is_current() -> None:
    """If this fails, run `adx config reference > docs/configuration.md` and commit the page."""
    assert DOC.read_text() == configuration_reference()


def test_every_key_of_every_component_is_in_the_reference() -> None:
    text = configuration_reference()
    for name in COMPONENTS:
        assert f"## `{name}`" in text
        for key in component_model(name).model_fields:
            # a plain key is a row; a nested model is a table heading such as `[logging]` or `[a.logging]`
            assert f"`{key}`" in text or f"{key}]`" in text, (name, key)


def test_a_key_shows_its_type_default_bounds_and_description() -> None:
    text = configuration_reference(["coordinator"])
    row = next(line for line in text.splitlines() if line.startswith("| `leader_lease_seconds` |"))
    cells = [cell.strip() for cell in row.strip("|").split(" | ")]
    assert cells[1:3] == ["number", "`5.0`"]
    assert cells[3].startswith("HA: TTL of the leader lease") and cells[3].endswith("(>= 0.5, <= 60)")


def test_the_command_prints_it_and_refuses_an_unknown_component() -> None:
    run = [sys.executable, "-m", "adx", "config", "reference", "--component", "execd"]
    done = subprocess.run(run, capture_output=True, text=True, timeout=60, check=True)
    assert "## `execd`" in done.stdout and "## `coordinator`" not in done.stdout
    bad = subprocess.run([*run[:-1], "nosuch"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "unknown component 'nosuch'" in bad.stderr


def _keys_without_description(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for key, field in model.model_fields.items():
        nested = [a for a in _members(field.annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        if nested:
            for sub in nested:
                yield from _keys_without_description(sub, f"{prefix}{key}.")
        elif not field.description:
            yield f"{prefix}{key}"


def _members(annotation: object) -> Iterator[object]:
    yield annotation
    for arg in typing.get_args(annotation):
        yield from _members(arg)


def test_every_key_has_a_description() -> None:
    """The reference is for people: a key without a description is a question in an operator's head."""
    missing = {name: list(_keys_without_description(component_model(name))) for name in COMPONENTS}
    assert not any(missing.values()), {name: keys for name, keys in missing.items() if keys}
