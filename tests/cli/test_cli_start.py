"""Client commands start without the server stack (issue 17: `adx --help` and `adx env list` under 300 ms;
the time itself is measured by bench/bench_cli_start.py, not asserted here): what a real `adx` process
imports, and the command table `adx --help` lists from without importing any command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import typer

from adx.cli._app import COMMANDS, app, load_command

SERVER_STACK = ["pydantic", "grpc", "fastapi", "uvicorn", "redis", "psycopg", "cryptography", "adx.config"]

PROBE = """
import json, sys
sys.argv = ["adx", *json.loads(sys.argv[1])]
from adx.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(name for name, module in sys.modules.items() if module is not None and (
      name.split(".")[0] in {"pydantic", "grpc", "fastapi", "uvicorn", "redis", "psycopg", "cryptography", "httpx",
      "rich"} or name.startswith("adx.")))))
"""


def imported_by(*args: str, **env: str) -> tuple[set[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "XDG_CONFIG_HOME": "/nonexistent", **env},
    )
    *output, modules = done.stdout.rstrip("\n").split("\n")
    return set(json.loads(modules)), "\n".join(output) + done.stderr


def loaded(modules: set[str], prefixes: list[str]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_help_lists_every_command_without_importing_any() -> None:
    modules, output = imported_by("--help")
    for name, entry in COMMANDS.items():
        assert name in output and entry.help[:40] in output, (name, output)
    assert loaded(modules, [*SERVER_STACK, "httpx"]) == []
    assert not [m for m in modules if m.startswith("adx.cli._") and m not in ("adx.cli._app",)], modules


def test_env_list_imports_the_sdk_but_not_the_server_stack() -> None:
    from adx.embedded._process import pick_free_port

    modules, output = imported_by(
        "env", "list", ADX_API_URL=f"http://127.0.0.1:{pick_free_port('127.0.0.1')}", ADX_API_KEY="k"
    )
    assert "cannot reach the ADX API" in output  # it ran for real (nothing listens there)
    assert "adx.sdk" in modules and "httpx" in modules
    assert loaded(modules, ["grpc", "fastapi", "uvicorn", "redis", "psycopg", "cryptography", "adx.config"]) == []
    assert loaded(modules, ["adx.api", "adx.coordinator", "adx.node", "adx.embedded", "adx.agents"]) == []


def test_the_command_table_matches_the_commands() -> None:
    """Each line `adx --help` shows without importing is the command's own first help line, and every command
    the modules register is in the table (one that is not could never be run)."""
    for name, entry in COMMANDS.items():
        command = load_command(name)
        assert command.get_short_help_str(limit=500) == entry.help, name
    registered = set(typer.main.get_group(app).commands)
    assert registered == set(COMMANDS)


def test_a_mistyped_command_is_answered_with_the_closest_names() -> None:
    done = subprocess.run([sys.executable, "-m", "adx", "evn", "list"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "No such command 'evn'. Did you mean 'env'?" in done.stderr, done.stderr
