"""execd's runtime (the files sandboxd copies to ``/opt/adx`` for sandboxes on a store image, where execd runs on
the image's own python3) holds every ``adx`` module execd can import, at start-up or later inside a function.

A module missing from ``RUNTIME_MODULES`` is found only in a sandbox on a store image: its execd exits at start
and the Environment fails ("ended before it was ready: exited with status 1")."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from adx.execd._launch import RUNTIME_MODULES, install_runtime

_SRC = Path(__file__).resolve().parents[2] / "src"


def _adx_imports(path: Path) -> set[str]:
    """Every ``adx...`` module a file imports, wherever the import stands (module level or in a function)."""
    names: set[str] = set()
    package = ".".join(path.relative_to(_SRC).with_suffix("").parts[:-1])
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for inner in ast.walk(block)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.split(".")[0] == "adx")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base]) if base else ".".join(parent)
            if base.split(".")[0] != "adx":
                continue
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # a submodule imported by name
    return names


def _module_file(name: str) -> str | None:
    """The runtime-relative file of module ``name``, or None when it names no module (a function, a class)."""
    parts = name.split(".")
    for candidate in (Path(*parts).with_suffix(".py"), Path(*parts) / "__init__.py"):
        if (_SRC / candidate).is_file():
            return candidate.as_posix()
    return None


def test_every_adx_module_execd_imports_is_in_its_runtime() -> None:
    shipped = set(RUNTIME_MODULES)
    missing: dict[str, set[str]] = {}
    for rel in RUNTIME_MODULES:
        if rel == "adx/__init__.py":
            continue  # the SDK's names, loaded on first use (PEP 562): execd never uses them
        for name in _adx_imports(_SRC / rel):
            module = _module_file(name)
            if module is not None and module not in shipped:
                missing.setdefault(module, set()).add(rel)
    assert not missing, f"imported by execd but not in RUNTIME_MODULES: {missing}"


def test_execd_starts_from_its_runtime_alone(tmp_path: Path) -> None:
    """Without site-packages (so the installed ``adx`` is out of reach) execd's entry imports from the copy."""
    runtime = install_runtime(tmp_path / "runtime", compile_bytecode=False)
    probe = (
        "import adx.execd._main, adx.execd._daemon, sys; "
        "assert all(m.__file__.startswith(sys.argv[1]) for n, m in sys.modules.items() if n.startswith('adx'))"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", probe, str(runtime)],
        env={"PYTHONPATH": str(runtime)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
