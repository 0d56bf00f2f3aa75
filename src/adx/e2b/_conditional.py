"""Conditional requests on envd's ``GET /files``, as envd answers them: Go's ``http.ServeContent`` with the file's
modification time and no ETag (envd sets none), RFC 9110 13.

In Go's order: ``If-Match`` (only ``*`` matches: there is no ETag; anything else is 412), else
``If-Unmodified-Since`` (412 when the file changed after it); then ``If-None-Match`` (``*`` is 304; any ETag
list matches nothing, so the file is sent), else ``If-Modified-Since`` (304 when the file did not change after
it). A ``Range`` counts only where ``If-Range`` (when given) is the file's ``Last-Modified`` to the second; an
ETag or another date there answers the whole file. Dates are compared in whole seconds; one that does not parse
is ignored (as Go's); a time of 0 (no ``Last-Modified``) skips the date checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from enum import Enum

__all__ = ["Verdict", "http_seconds", "precondition", "range_counts"]


class Verdict(Enum):
    SEND = 200
    NOT_MODIFIED = 304
    PRECONDITION_FAILED = 412


def http_seconds(value: str | None) -> int | None:
    """An HTTP date (IMF-fixdate, RFC 850 or asctime) as Unix seconds; None: absent or not a date."""
    if not value:
        return None
    try:
        return int(parsedate_to_datetime(value.strip()).timestamp())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _etags(value: str) -> tuple[bool, bool]:
    """(a ``*``, the list parses) of an ``If-Match``/``If-None-Match`` list, read as Go's ``scanETag`` loop reads
    it: a malformed entry ends the reading there (what came before stands)."""
    rest = value.strip()
    while rest:
        if rest[0] == ",":
            rest = rest[1:].strip()
            continue
        if rest[0] == "*":
            return True, True
        start = 2 if rest.startswith("W/") else 0
        if len(rest) - start < 2 or rest[start] != '"':
            return False, False
        close = rest.find('"', start + 1)
        if close < 0 or any(ord(c) <= 0x20 or ord(c) == 0x7F for c in rest[start + 1 : close]):
            return False, False
        rest = rest[close + 1 :].strip()
    return False, True


def precondition(headers: Mapping[str, str], mtime: int | None) -> Verdict:
    """What a GET's conditional headers decide for a file last modified at ``mtime`` (seconds; None: unknown)."""
    if_match = headers.get("if-match")
    failed = False
    if if_match is not None and if_match.strip():
        star, _ = _etags(if_match)
        failed = not star  # no ETag: only "*" matches
    else:
        since = http_seconds(headers.get("if-unmodified-since"))
        failed = mtime is not None and since is not None and mtime > since
    if failed:
        return Verdict.PRECONDITION_FAILED
    if_none_match = headers.get("if-none-match")
    if if_none_match is not None and if_none_match.strip():
        star, _ = _etags(if_none_match)
        return Verdict.NOT_MODIFIED if star else Verdict.SEND
    since = http_seconds(headers.get("if-modified-since"))
    if mtime is not None and since is not None and mtime <= since:
        return Verdict.NOT_MODIFIED
    return Verdict.SEND


def range_counts(headers: Mapping[str, str], mtime: int | None) -> bool:
    """Whether a ``Range`` is honoured: always without ``If-Range``; with one, only when it is the file's date."""
    if_range = headers.get("if-range")
    if not if_range:
        return True
    text = if_range.strip()
    if text.startswith('"') or text.startswith('W/"'):
        return False  # an ETag: the file has none, so it does not match
    when = http_seconds(text)
    return mtime is not None and when is not None and when == mtime
