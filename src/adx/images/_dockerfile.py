"""The Dockerfile subset ``adx image build`` reads: FROM, RUN, COPY, ENV, WORKDIR, USER, ARG.

Line continuations (``\\``), comments and blank lines as Docker has them; ``RUN`` in shell form or exec form
(a JSON list); ``ENV K=V ...`` or ``ENV K V``; ``ARG NAME[=default]``; ``$VAR``/``${VAR}`` substitution of ARG and
ENV values in every instruction but ``RUN`` (the shell expands those itself, with ARGs in its environment).
Anything else is refused with its line number: a silently skipped instruction would build the wrong image.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from enum import StrEnum

from adx.errors import InvalidInputError

__all__ = ["Instruction", "Op", "parse_dockerfile", "substitute"]


class Op(StrEnum):
    FROM = "FROM"
    RUN = "RUN"
    COPY = "COPY"
    ENV = "ENV"
    WORKDIR = "WORKDIR"
    USER = "USER"
    ARG = "ARG"


@dataclass(frozen=True)
class Instruction:
    op: Op
    line: int
    #: FROM: [image]; RUN: argv (exec form) or [shell text] with shell=True; COPY: [src..., dest];
    #: ENV/ARG: flattened [k, v, k, v...] (ARG without default: v is None-free "" with has_default False);
    #: WORKDIR/USER: [value]
    args: tuple[str, ...]
    shell: bool = False
    defaults: dict[str, bool] = field(default_factory=dict)  # ARG: name -> has a default
    #: RUN: the account this one step runs as (E2B's ``run_cmd(user=)``), else the current USER's;
    #: COPY: ``user[:group]`` owning the copied files (E2B's ``copy(user=)``), else root. Never from a Dockerfile.
    user: str | None = None
    #: COPY: the copied files' permission bits (E2B's ``copy(mode=)``), else as in the context.
    mode: int | None = None

    def text(self) -> str:
        """Canonical text (the part of a layer's cache key this step contributes)."""
        if self.op is Op.RUN and not self.shell:
            return f"RUN {json.dumps(list(self.args))}"
        if self.op is Op.COPY and (self.user is not None or self.mode is not None):
            mode = f"{self.mode:o}" if self.mode is not None else None
            return f"COPY {json.dumps(list(self.args))} {json.dumps({'user': self.user, 'mode': mode})}"
        return f"{self.op.value} {json.dumps(list(self.args))}"


_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def substitute(value: str, env: dict[str, str]) -> str:
    """``$NAME``, ``${NAME}`` and ``${NAME:-default}`` from ``env`` (unknown: empty, as Docker does)."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        got = env.get(name, "")
        if m.group(2) is not None and not got:
            return m.group(2)
        return got

    return _VAR.sub(one, value)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # comment lines inside a continuation are dropped, as Docker does
        if not buf:
            start = number
        if raw.rstrip().endswith("\\"):
            buf.append(raw.rstrip()[:-1])
            continue
        buf.append(raw)
        out.append((start, " ".join(part.strip() for part in buf).strip()))
        buf = []
    if buf:
        out.append((start, " ".join(part.strip() for part in buf).strip()))
    return out


def _bad(line: int, reason: str) -> InvalidInputError:
    return InvalidInputError("dockerfile", f"line {line}: {reason}", details={"line": line})


def _pairs(line: int, op: Op, rest: str) -> tuple[str, ...]:
    words = shlex.split(rest)
    if not words:
        raise _bad(line, f"{op.value} needs arguments")
    if "=" not in words[0]:
        if op is Op.ARG:
            return (words[0], "")
        if len(words) < 2:
            raise _bad(line, "ENV needs NAME=VALUE or NAME VALUE")
        return (words[0], rest.split(None, 1)[1].strip())
    flat: list[str] = []
    for word in words:
        name, eq, value = word.partition("=")
        if not eq and op is not Op.ARG:
            raise _bad(line, f"{op.value}: {word!r} is not NAME=VALUE")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise _bad(line, f"{op.value}: {name!r} is not a variable name")
        flat += [name, value]
    return tuple(flat)


def parse_dockerfile(text: str) -> list[Instruction]:
    steps: list[Instruction] = []
    for line, content in _logical_lines(text):
        word, _, rest = content.partition(" ")
        rest = rest.strip()
        try:
            op = Op(word.upper())
        except ValueError:
            raise _bad(line, f"{word} is not supported (FROM, RUN, COPY, ENV, WORKDIR, USER, ARG are)") from None
        if op is not Op.ARG and not steps and op is not Op.FROM:
            raise _bad(line, "the first instruction must be FROM (or ARG)")
        if op is Op.FROM:
            if any(s.op is Op.FROM for s in steps):
                raise _bad(line, "multi-stage builds (a second FROM) are not supported")
            parts = rest.split()
            if len(parts) != 1:
                raise _bad(line, "FROM takes one image name (no AS, no --platform)")
            steps.append(Instruction(op, line, (parts[0],)))
        elif op is Op.RUN:
            if not rest:
                raise _bad(line, "RUN needs a command")
            if rest.startswith("["):
                try:
                    argv = json.loads(rest)
                except ValueError:
                    argv = None
                if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                    raise _bad(line, "RUN in exec form must be a JSON list of strings")
                steps.append(Instruction(op, line, tuple(argv)))
            else:
                steps.append(Instruction(op, line, (rest,), shell=True))
        elif op is Op.COPY:
            parts = shlex.split(rest)
            if any(p.startswith("--") for p in parts):
                raise _bad(line, "COPY options (--from, --chown, ...) are not supported")
            if len(parts) < 2:
                raise _bad(line, "COPY needs at least one source and a destination")
            steps.append(Instruction(op, line, tuple(parts)))
        elif op in (Op.ENV, Op.ARG):
            flat = _pairs(line, op, rest)
            defaults = {}
            if op is Op.ARG:
                for name, value in zip(flat[::2], flat[1::2], strict=True):
                    defaults[name] = value != "" or f"{name}=" in rest
            steps.append(Instruction(op, line, flat, defaults=defaults))
        else:  # WORKDIR, USER
            if not rest:
                raise _bad(line, f"{op.value} needs a value")
            if op is Op.WORKDIR and not rest.startswith(("/", "$")):
                raise _bad(line, "WORKDIR must be an absolute path")
            steps.append(Instruction(op, line, (rest,)))
    if not any(s.op is Op.FROM for s in steps):
        raise _bad(1, "no FROM instruction")
    return steps
