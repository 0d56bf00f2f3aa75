"""One JSON style for every command (docs/cli.md#output): indented by two spaces, keys in the API's order,
no colour, the same bytes on a terminal and in a pipe; only a stream (``adx env logs --json``) is JSON Lines.
The commands that need a cluster check it where they run (test_volume_cli, test_env_token_cli)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import adx.cli

CLI_DIR = Path(adx.cli.__file__).parent


def adx_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "adx", *args], capture_output=True, text=True, timeout=60)


def test_print_argv_and_config_show_print_the_one_style(tmp_path: Path) -> None:
    execd = tmp_path / "execd.toml"
    execd.write_text(f'socket = "{tmp_path}/s"\ncontrol_socket = "{tmp_path}/c"\nsandbox_id = "sb1"\n')
    argv = adx_run("execd", "--config", str(execd), "--print-argv")
    assert argv.returncode == 0, argv.stderr
    assert argv.stdout == json.dumps(json.loads(argv.stdout), indent=2) + "\n", argv.stdout

    shown = adx_run("config", "check", str(execd), "--component", "execd", "--show")
    assert shown.returncode == 0, shown.stderr
    config = json.loads(shown.stdout)
    assert config["sandbox_id"] == "sb1"
    assert shown.stdout == json.dumps(config, indent=2) + "\n", shown.stdout


def test_no_command_prints_json_but_through_the_one_helper() -> None:
    """Every JSON a command prints goes through ``adx.cli._output`` (rich's ``print_json`` or a bare
    ``json.dumps`` to stdout was how the two styles came about). The one other ``json.dumps``: a run's result
    shown inline in ``adx agent runs get``'s text."""
    found = []
    for path in sorted(CLI_DIR.glob("*.py")):
        if path.name == "_output.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                name = node.func.attr
                owner = ast.unparse(node.func.value)
                if name == "print_json" or (name == "dumps" and owner == "json"):
                    found.append(f"{path.name} {ast.unparse(node.func)}")
    assert found == ["_agent.py json.dumps"], found
