"""Query parameters of ``GET /v1/environments/{id}/logs``, shared by the sync and async clients."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TypedDict, Unpack

from adx.errors import InvalidInputError
from adx.model import MAX_LOG_LINES, MAX_LOG_WAIT_SECONDS
from adx.sdk._models import check_keywords

#: A follow's long poll: each request waits this long for a new line (the server's limit is 60 s).
FOLLOW_WAIT_SECONDS = 25.0


class LogsQuery(TypedDict, total=False):
    """What ``env.logs(**)`` asks for (each optional)."""

    tail: int | None  # the last N lines (not with a cursor)
    since: datetime | None  # lines read since then (a naive datetime is UTC)
    cursor: str | None  # the lines after an earlier page's cursor
    limit: int  # at most this many lines (default 1000)
    wait_seconds: float  # wait that long for a new line (default 0)


def logs_params(**query: Unpack[LogsQuery]) -> dict[str, str]:
    """Checked here so a bad argument names itself before any request is made."""
    check_keywords("logs", query, LogsQuery)
    tail, since, cursor = query.get("tail"), query.get("since"), query.get("cursor")
    limit, wait_seconds = query.get("limit", 1000), query.get("wait_seconds", 0.0)
    if tail is not None and not 0 <= tail <= MAX_LOG_LINES:
        raise InvalidInputError("tail", f"must be between 0 and {MAX_LOG_LINES}, got {tail}")
    if not 1 <= limit <= MAX_LOG_LINES:
        raise InvalidInputError("limit", f"must be between 1 and {MAX_LOG_LINES}, got {limit}")
    if not 0 <= wait_seconds <= MAX_LOG_WAIT_SECONDS:
        raise InvalidInputError("wait_seconds", f"must be between 0 and {MAX_LOG_WAIT_SECONDS:g}, got {wait_seconds}")
    params = {"limit": str(limit)}
    if tail is not None and cursor is None:
        params["tail"] = str(tail)
    if since is not None:
        params["since"] = (since if since.tzinfo else since.replace(tzinfo=UTC)).isoformat()
    if cursor:
        params["cursor"] = cursor
    if wait_seconds:
        params["waitSeconds"] = f"{wait_seconds:g}"
    return params
