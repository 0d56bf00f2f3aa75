"""Lines of user code for issue 15's 4-step workflow (a side effect and an approval), before and after the
authoring layer: bench/authoring_loc/refund_seed.py (+ its worker TOML) with the seed's names against
examples/agents/agents_quickstart.py. Counts code lines only: no blank lines, comments or docstrings.

Each top-level statement is counted as "logic" (the steps, the tool and its reconcile hook, without their
decorators), "state" (the state model or the JSON schemas), "submit" (the submitting script) or "wiring"
(everything else: imports, registration, edges, registry building, worker configuration).

    python bench/bench_authoring_loc.py
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE = ROOT / "bench" / "authoring_loc" / "refund_seed.py"
BEFORE_CONFIG = ROOT / "bench" / "authoring_loc" / "refund_seed.toml"
AFTER = ROOT / "examples" / "agents" / "agents_quickstart.py"
LOGIC = {"append_line", "paid", "find_payment", "pay", "check", "approve", "pay_out", "finish"}  # bodies only
STATE = {"Refund", "register_schemas", "INPUT", "OUTPUT"}  # the state and its schemas
SUBMIT = {"main"}  # submit, approve, wait, print


def code_lines(source: str) -> set[int]:
    """Line numbers that hold code (not blank, not only a comment, not a docstring)."""
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            continue
        if tok.type == tokenize.ENDMARKER:
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                lines.difference_update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return lines


def split(path: Path) -> dict[str, int]:
    source = path.read_text()
    code = code_lines(source)
    counts = dict.fromkeys(("logic", "state", "submit", "wiring"), 0)
    for node in ast.parse(source).body:
        name = getattr(node, "name", None)
        if name is None and isinstance(node, ast.Assign | ast.AnnAssign):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            name = getattr(target, "id", None)
        span = set(range(node.lineno, (node.end_lineno or node.lineno) + 1))  # a def's span starts at "def"
        kind = "logic" if name in LOGIC else "state" if name in STATE else "submit" if name in SUBMIT else "wiring"
        counts[kind] += len(code & span)
    counts["wiring"] += len(code) - sum(counts.values())  # decorators
    return counts


def main() -> None:
    before = split(BEFORE)
    before["wiring"] += len([line for line in BEFORE_CONFIG.read_text().splitlines() if line.strip()])
    after = split(AFTER)
    kinds = list(before)
    print(f"{'':<28}" + "".join(f"{k:>8}" for k in [*kinds, "total"]))
    for label, counts in (("seed names (+ worker TOML)", before), ("authoring layer", after)):
        print(f"{label:<28}" + "".join(f"{counts[k]:>8}" for k in kinds) + f"{sum(counts.values()):>8}")


if __name__ == "__main__":
    main()
