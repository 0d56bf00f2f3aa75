"""The web dashboard at ``/ui``: static HTML, CSS and a little JavaScript that call the same JSON API as the SDK.

The server renders nothing per user and keeps no session: the page asks for a tenant's API key or the admin key,
keeps it in the tab's ``sessionStorage`` and sends it as ``Authorization: Bearer`` on each API call, so every
check stays where the API already does it. The files ship as package data (``_ui_static``) and are served from
a fixed list (no path from the request reaches the filesystem), under a CSP that allows only this origin's own
script and style: no inline code, no eval, no third-party fetch, no framing.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from adx.errors import NotFoundError

__all__ = ["CSP", "ui_router"]

#: Only this origin's files and API; ``form-action 'none'``: the forms are handled by script, never submitted.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # A new release's files take effect at the next load; the key is never in them, but nothing needs caching.
    "Cache-Control": "no-store",
}

#: The served files and their media types: the whole dashboard.
_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "terminal.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


@cache
def _asset(name: str) -> bytes:
    return (files("adx.api") / "_ui_static" / name).read_bytes()


def _serve(name: str) -> Response:
    media_type = _ASSETS.get(name)
    if media_type is None:
        raise NotFoundError(f"no dashboard file {name[:80]!r}")
    return Response(_asset(name), media_type=media_type, headers=_HEADERS)


ui_router = APIRouter(include_in_schema=False)


@ui_router.get("/ui")
async def ui_root() -> RedirectResponse:
    # Relative asset URLs in index.html resolve under /ui/ only with the trailing slash.
    return RedirectResponse("/ui/", status_code=308)


@ui_router.get("/ui/")
async def ui_index() -> Response:
    return _serve("index.html")


@ui_router.get("/ui/{name}")
async def ui_file(name: str) -> Response:
    return _serve(name)
