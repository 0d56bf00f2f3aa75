"""Importing an application for a worker: ``MODULE``, ``MODULE:APP`` or ``path/to/file.py``, with the current
directory importable (as ``python -m`` does) and errors that say what to do instead of a bare ImportError."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

from adx.agents._authoring import App, apps_in, registrations
from adx.errors import InvalidInputError

__all__ = ["load_application"]


def _import(module_name: str, field: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            shown = ", ".join(repr(p) for p in sys.path[:4]) + (", ..." if len(sys.path) > 4 else "")
            raise InvalidInputError(
                field,
                f"no module named {module_name!r}: looked in sys.path [{shown}] (the current directory"
                f" {os.getcwd()!r} first). Run from the directory that holds {module_name.replace('.', '/')}.py,"
                " pass the file's path (path/to/app.py), or install the package that provides it",
            ) from None
        raise InvalidInputError(
            field,
            f"importing {module_name!r} failed: it imports {exc.name!r}, which is not installed"
            f" (pip install it into {sys.prefix!r})",
        ) from None
    except Exception as exc:
        raise InvalidInputError(
            field, f"importing {module_name!r} raised {type(exc).__name__}: {exc} (an error in the module itself)"
        ) from exc


def load_application(spec: str, *, field: str = "registrations") -> ModuleType:
    """The registrations module a worker builds its registry from (``register_graphs`` and friends).

    ``spec``: a dotted module (its :class:`App` objects, or its own ``register_graphs``), ``MODULE:APP`` (that
    App only) or a ``.py`` file (its directory becomes importable)."""
    target, _, attr = spec.partition(":")
    if target.endswith(".py"):
        path = Path(target).absolute()
        if not path.is_file():
            raise InvalidInputError(field, f"{target!r} is not a file (from {os.getcwd()!r})")
        folder, target = str(path.parent), path.stem
    else:
        folder = os.getcwd()
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module = _import(target, field)
    if attr:
        found = getattr(module, attr, None)
        if not isinstance(found, App):
            names = [name for name, value in vars(module).items() if isinstance(value, App)]
            raise InvalidInputError(
                field, f"{target!r} has no adx.agents.App named {attr!r} (it has {names or 'none'})"
            )
        return registrations([found], f"{target}:{attr}")
    if callable(getattr(module, "register_graphs", None)):
        return module
    apps = apps_in(module)
    if not apps:
        raise InvalidInputError(
            field, f"{target!r} defines no adx.agents.App and no register_graphs(executables) function"
        )
    return registrations(apps, target)
