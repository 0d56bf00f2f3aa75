"""How a command prints and ends: ONE JSON style for every ``--json`` (and other JSON a command prints), one
way to end on an ``AdxError``, and one shape of listing (plain columns, or the JSON object).

The JSON style (docs/cli.md#output): an object or array indented by two spaces, keys in the order the HTTP API
gives them, ASCII-escaped, no colour and no wrapping, whether stdout is a terminal or a pipe (the same bytes
either way: what a person reads is what a script parses). A stream (``adx env logs --json``) is the one
exception: one compact object a line (JSON Lines), flushed as each arrives, so ``jq`` or a reader sees it then.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, TypeVar

import typer

from adx.cli._app import console, fail
from adx.cli._human import table
from adx.errors import AdxError

T = TypeVar("T")

Json = Annotated[bool, typer.Option("--json", help="print the HTTP API's JSON object instead of text")]


def print_json(value: object) -> None:
    """``value`` (JSON-able) on stdout in the one ``--json`` style."""
    # Plain write, not rich: rich colours and may reflow, and this output is for programs as much as for people.
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def print_json_line(value: object) -> None:
    """One item of a stream on its own line (JSON Lines), flushed at once (a follower waits on it)."""
    sys.stdout.write(json.dumps(value, default=str) + "\n")
    sys.stdout.flush()


@contextmanager
def failing(restate: Callable[[AdxError], AdxError] | None = None) -> Iterator[None]:
    """Run the block; an ``AdxError`` ends the command with its message on stderr and its exit status (first
    ``restate``d: an input error of the SDK named as the command-line flag the user typed)."""
    try:
        yield
    except AdxError as exc:
        fail(exc if restate is None else restate(exc))


def print_listing(
    items: Sequence[T],
    as_json: bool,
    *,
    key: str,
    wire: Callable[[T], object],
    header: tuple[str, ...],
    row: Callable[[T], tuple[str, ...]],
    empty: str | None = None,
) -> None:
    """A list command's answer: ``{key: [wire(item), ...]}`` with ``--json``, else ``empty`` when there are no
    items (when given), else plain columns that never cut a cell."""
    if as_json:
        print_json({key: [wire(item) for item in items]})
    elif not items and empty is not None:
        console.print(empty, highlight=False)
    else:
        sys.stdout.write(table(header, [row(item) for item in items]))
