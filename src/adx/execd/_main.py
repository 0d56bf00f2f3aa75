"""The lean execd entry point: parse the argv (:mod:`adx.execd._options`), configure logging, run the daemon."""

from __future__ import annotations

import asyncio
import sys

from adx.execd import _http
from adx.execd._daemon import Execd
from adx.execd._options import parse_argv
from adx.logs import configure_logging

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    options = parse_argv(sys.argv[1:] if argv is None else argv)
    _http.BODY_IDLE_TIMEOUT = options.body_idle_timeout
    _http.WRITE_TIMEOUT = options.write_timeout
    configure_logging("execd", options.log_level, options.log_format)
    return asyncio.run(Execd(options).run())
