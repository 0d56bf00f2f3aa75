"""Every file in examples/ runs, as a user would run it, against a real ``adx up`` (issue 17: runnable examples
that CI executes). A new example is picked up here by itself; one that fails or hangs fails this test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import UpCluster

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.py"))

#: What each example must print (beyond exiting 0): proof that it did its work, not only that it ran.
EXPECTED = {
    "quickstart.py": ["hello from", "first line\nsecond line", "deleted env-"],
    "pause_and_resume.py": ["state after pause: paused", "step 1 done", "warm"],
    "parallel_async.py": ["squares: [4, 9, 16]"],
    "e2b_unchanged.py": ["hello from e2b on adx", "data.csv"],
    "e2b_volumes.py": ["seen by a second sandbox: HELLO FROM THE VOLUME API", "read through the volume API: HELLO"],
}


def test_every_example_has_an_expectation() -> None:
    assert EXAMPLES, "examples/ is empty"
    assert sorted(path.name for path in EXAMPLES) == sorted(EXPECTED)


@pytest.mark.parametrize("example", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_example_runs_against_adx_up(up_cluster: UpCluster, example: Path, tmp_path: Path) -> None:
    credentials = json.loads((up_cluster.config_home / "adx" / "credentials.json").read_text())
    # The SDK finds the cluster through the saved credentials; the e2b SDK through the variables docs/e2b.md names.
    env = up_cluster.env(
        E2B_API_URL=credentials["api_url"],
        E2B_SANDBOX_URL=credentials["api_url"],
        E2B_API_KEY=credentials["api_key"],
        E2B_VOLUME_API_URL=credentials["api_url"],
    )
    done = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, f"{example.name} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    for expected in EXPECTED[example.name]:
        assert expected in done.stdout, f"{example.name} did not print {expected!r}:\n{done.stdout}"
