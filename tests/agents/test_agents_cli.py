"""``adx agent worker --config FILE``: configuration errors exit at once naming the key (AGT-13)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-c", "from adx.cli import main; main()", "agent", "worker", "--config"]


def _run(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, str(config)], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.req("AGT-13")
def test_config_errors_name_the_key(tmp_path: Path, postgres_dsn: str) -> None:
    config = tmp_path / "w.toml"
    config.write_text(f'database_url = "{postgres_dsn}"\nregistrations = "agents_testapp"\nslots = 0\n')
    done = _run(config)
    assert done.returncode == 2 and "slots" in done.stderr
    config.write_text(f'database_url = "{postgres_dsn}"\nregistrations = "agents_testapp"\nslotz = 4\n')
    done = _run(config)
    assert done.returncode == 2 and "slotz: unknown key" in done.stderr
    config.write_text(f'database_url = "{postgres_dsn}"\nregistrations = "no_such_module_xyz"\n')
    done = _run(config)
    assert done.returncode == 2 and "registrations" in done.stderr and "no_such_module_xyz" in done.stderr
