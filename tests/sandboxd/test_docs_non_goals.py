"""SBX-15: the sandboxd documentation states each of its non-goals."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "sandboxd.md"

# Each non-goal of SPEC SBX-15 and the words that must state it, in the doc's non-goals section.
NON_GOALS = {
    "no maintenance while the daemon is down past a TTL": [
        r"no maintenance while the daemon is down past a ttl",
        r"host supervision .* must\s+enforce termination",
    ],
    "no live sandboxes across a host reboot": [r"no live sandboxes across a host reboot"],
    "the registry is not an execution history": [r"the registry is not an execution history"],
    "a restart does not undo external calls": [r"a restart does not undo external calls", r"rolls back nothing"],
    "no cross-host failover or automatic backup": [r"no cross-host failover and no automatic backup"],
}


@pytest.mark.req("SBX-15")
def test_the_sandboxd_doc_states_each_non_goal() -> None:
    text = DOC.read_text()
    assert "## Non-goals (SBX-15)" in text
    section = text.split("## Non-goals (SBX-15)", 1)[1].split("\n## ", 1)[0]
    flat = re.sub(r"\s+", " ", section.replace("*", "")).lower()
    bullets = [line for line in section.splitlines() if line.startswith("- ")]
    assert len(bullets) == len(NON_GOALS), bullets
    missing = [goal for goal, patterns in NON_GOALS.items() if not all(re.search(p, flat) for p in patterns)]
    assert not missing, f"docs/sandboxd.md does not state: {missing}"
