"""execd's own cost per sandbox: idle memory and what it imports; the hand-written URL parsing."""

from __future__ import annotations

import subprocess
import sys
import time
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from execd_helpers import ExecdProcess, rss_kib, run
from hypothesis import given
from hypothesis import strategies as st

from adx.execd._http import parse_target


def test_idle_rss_is_at_most_20_mib(execd: ExecdProcess) -> None:
    with execd.client() as client:
        run(client, argv=["true"])  # warm: one full request path has run
    time.sleep(0.2)
    rss_mib = rss_kib(execd.pid) / 1024
    print(f"execd idle VmRSS {rss_mib:.1f} MiB, RssAnon {rss_kib(execd.pid, 'RssAnon') / 1024:.1f} MiB")
    assert rss_mib <= 20, f"execd idle RSS {rss_mib:.1f} MiB"


def test_lean_entry_imports_no_heavy_modules() -> None:
    code = (
        "import sys, runpy; sys.argv = ['execd', '--help']\n"
        "try:\n    runpy.run_module('adx.execd', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print(' '.join(sorted(k for k, v in sys.modules.items() if v is not None)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    loaded = set(out.stdout.splitlines()[-1].split())
    for heavy in ("pydantic", "typer", "rich", "httpx", "ssl", "urllib.parse", "pathlib", "dataclasses"):
        assert heavy not in loaded, f"execd imports {heavy}"


@given(st.text(), st.text(), st.text())
def test_target_parsing_matches_urllib(path: str, key: str, value: str) -> None:
    # "/p" prefix: urlsplit would read a leading "//" as an authority, which an HTTP origin-form target is not.
    target = "/p" + quote(path, safe="/") + "?" + quote(key, safe="") + "=" + quote(value, safe="") + "&x=1"
    split = urlsplit(target)
    expected = (unquote(split.path), dict(parse_qsl(split.query, keep_blank_values=True)))
    assert parse_target(target) == expected
