"""One logging setup for every ADX daemon and command.

Lines are structured: either JSON objects or ``key=value`` pairs, always carrying the component name.
Extra context is passed with ``logger.info("msg", extra={"env_id": ..., "generation": ...})`` and lands
as fields of the line.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Literal, TextIO

__all__ = ["LogFormat", "configure_logging"]

LogFormat = Literal["json", "kv"]

# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is structured context.
# "color_message" is uvicorn's ANSI-coloured copy of the message for terminals: not context.
_STANDARD_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime", "color_message"}


#: A log line's fields by name: the standard ones and each ``extra=`` value (any object; JSON, or its ``str``).
LogFields = dict[str, object]


def _context_fields(record: logging.LogRecord) -> LogFields:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_RECORD_ATTRS}


def _timestamp(record: logging.LogRecord) -> str:
    millis = int(record.msecs)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{millis:03d}Z"


class _StructuredFormatter(logging.Formatter):
    def __init__(self, component: str, fmt: LogFormat) -> None:
        super().__init__()
        self._component = component
        self._fmt = fmt

    def format(self, record: logging.LogRecord) -> str:
        fields: LogFields = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "component": self._component,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields.update(_context_fields(record))
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self._fmt == "json":
            return json.dumps(fields, default=str, separators=(",", ":"))
        return " ".join(f"{key}={_kv_value(value)}" for key, value in fields.items())


def _kv_value(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text == "" or any(ch in text for ch in ' "=\n\t'):
        return json.dumps(text)
    return text


def configure_logging(
    component: str,
    level: str = "info",
    fmt: LogFormat = "kv",
    stream: TextIO | None = None,
) -> None:
    """Install the structured handler on the root logger (replacing earlier ADX handlers)."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_adx_handler", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_StructuredFormatter(component, fmt))
    handler._adx_handler = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(numeric)
    # httpx and httpcore log every request at info: the node's Relay and the daemons' health polls would
    # drown what matters. Their warnings still show; ``debug`` shows everything.
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(numeric if numeric <= logging.DEBUG else max(numeric, logging.WARNING))
