"""envd's plain HTTP routes: ``GET /files`` (download), ``POST /files`` (upload), ``GET /health``.

Uploads are ``application/octet-stream`` (``?path=``, optionally gzip-encoded) or ``multipart/form-data`` with
one ``file`` part per file whose filename is the target path; every file streams into execd's atomic write
(``PUT /v1/files?mkdirs=true``). Errors are ``{"code": <status>, "message": "..."}`` like envd's.
"""

from __future__ import annotations

import json
import mimetypes
import posixpath
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from adx.e2b._conditional import Verdict, http_seconds, precondition, range_counts
from adx.e2b._multipart import MultipartReader, boundary_of, disposition
from adx.e2b._ranges import ranged
from adx.e2b._upstream import Execd, close, execd_error, read_all
from adx.errors import InvalidInputError
from adx.model import FileEntry, FileStat, FileType


class HttpFailure(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def response(self) -> JSONResponse:
        return JSONResponse({"code": self.status, "message": self.message}, status_code=self.status)


def _failure(status: int, body: bytes) -> HttpFailure:
    _, message = execd_error(body)
    return HttpFailure(status if status in (400, 403, 404, 409) else 502, message or f"execd answered {status}")


async def _gunzip(stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        async for chunk in stream:
            if data := inflater.decompress(chunk):
                yield data
        if tail := inflater.flush():
            yield tail
    except zlib.error as exc:
        raise InvalidInputError("body", f"is not valid gzip: {exc}") from None


async def download(execd: Execd, request: Request, user: str) -> Response:
    """``user``: the account whose home a relative path is in (:mod:`adx.e2b._user`)."""
    path = request.query_params.get("path")
    if not path:
        raise HttpFailure(400, "path: required")

    async def opened() -> Response:
        upstream = await execd.open("GET", "/v1/files", query={"path": path, "user": user}, read_timeout=300.0)
        if upstream.status_code != 200:
            raise _failure(upstream.status_code, await read_all(upstream))
        # As envd (Go's ServeContent): the type by the name's extension, so a download URL opened in a browser
        # shows a page or an image; an unknown one stays octet-stream.
        upstream.headers["content-type"] = content_type(path)
        upstream.headers["vary"] = "Accept-Encoding"
        return upstream

    upstream = await opened()
    # execd says the file's modification time (Last-Modified): conditional requests are answered by it, as envd's.
    mtime = http_seconds(upstream.headers.get("last-modified"))
    verdict = precondition(request.headers, mtime)
    if verdict is not Verdict.SEND:
        await close(upstream)
        kept = {k: v for k, v in upstream.headers.items() if k in ("last-modified", "vary")}
        return Response(status_code=verdict.value, headers=kept)
    wanted = request.headers.get("range") if range_counts(request.headers, mtime) else None
    return await ranged(upstream, wanted, opened)


_COMPRESSED = {"gzip": "application/gzip", "bzip2": "application/x-bzip2", "xz": "application/x-xz"}


def content_type(path: str) -> str:
    guessed, compressed = mimetypes.guess_type(posixpath.basename(path), strict=False)
    if compressed is not None:  # x.tar.gz is a gzip file (its last extension), not a tar
        return _COMPRESSED.get(compressed, "application/octet-stream")
    if guessed is None:
        return "application/octet-stream"
    return f"{guessed}; charset=utf-8" if guessed.startswith("text/") else guessed


#: Where envd keeps a file's metadata: ``X-Metadata-<key>: value`` is the xattr ``user.e2b.<key>``.
METADATA_HEADER = "x-metadata-"
METADATA_XATTR = "user.e2b."
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+-.^_`|~")


def upload_metadata(request: Request) -> dict[str, str]:
    """The ``X-Metadata-*`` headers of an upload (keys lowercased, as envd), checked as the SDK checks them."""
    metadata: dict[str, str] = {}
    for name, value in request.headers.items():
        if not name.lower().startswith(METADATA_HEADER):
            continue
        key = name[len(METADATA_HEADER) :].lower()
        if not key or not set(key) <= _TOKEN_CHARS or len(METADATA_XATTR + key) > 255:
            raise HttpFailure(400, f"X-Metadata-{key}: keys are 1-{255 - len(METADATA_XATTR)} HTTP token characters")
        if not all(" " <= c <= "~" for c in value):
            raise HttpFailure(400, f"X-Metadata-{key}: values must be printable US-ASCII")
        metadata[key] = value
    return metadata


def metadata_of(entry: FileEntry) -> dict[str, str]:
    """The E2B metadata among execd's ``xattrs`` of an entry."""
    xattrs = entry.xattrs or {}
    return {k.removeprefix(METADATA_XATTR): v for k, v in xattrs.items() if k.startswith(METADATA_XATTR)}


async def _stat(execd: Execd, path: str, user: str) -> FileStat | None:
    status, body = await execd.call("GET", "/v1/files/stat", query={"path": path, "user": user})
    return FileStat.model_validate_json(body) if status == 200 else None


@dataclass(frozen=True)
class _Landing:
    path: str  # where the bytes go
    mode: int | None  # the permissions kept; None: a new file (0644, as envd's 0666 under umask 022)
    shown: str | None  # the path the answer names, when not ``path`` (a symlink's own)
    metadata: dict[str, str]  # the existing file's E2B metadata, kept as envd keeps its xattrs


async def _in_place(execd: Execd, path: str, user: str) -> _Landing:
    """envd writes in place (``O_TRUNC``): through a symlink to the file it points to (created when the link
    dangles), and an existing file keeps its permissions (a script made executable stays so). execd replaces a
    file atomically by a new one, so all is said to it: the target's path, the old mode and metadata."""
    described = await _stat(execd, path, user)
    shown = None
    if described is not None and described.type is FileType.SYMLINK and described.target:
        shown, path = described.path, described.target
        described = await _stat(execd, path, user) if described.target_type else None
    if described is None or described.type is not FileType.FILE:
        return _Landing(path, None, shown, {})
    return _Landing(path, described.mode, shown, metadata_of(described))


async def _write(
    execd: Execd, path: str, user: str, content: AsyncIterator[bytes], metadata: dict[str, str]
) -> dict[str, object]:
    """Written as ``user`` (its file, in its home when ``path`` is relative), parents made as needed."""
    landing = await _in_place(execd, path, user)
    kept_metadata = {**landing.metadata, **metadata}
    xattrs = {f"xattr.{METADATA_XATTR}{key}": value for key, value in kept_metadata.items()}
    kept = {"mode": f"{landing.mode:o}"} if landing.mode is not None else {}
    status, body = await execd.call(
        "PUT",
        "/v1/files",
        query={"path": landing.path, "user": user, "mkdirs": "true", **kept, **xattrs},
        content=content,
        content_type="application/octet-stream",
    )
    if status == 409:  # a directory in the way: envd's 400 (the SDK's InvalidArgumentException)
        raise HttpFailure(400, _failure(status, body).message)
    if status != 201:
        raise _failure(status, body)
    # execd's path: absolute, in the user's home if given relative; a symlink written through is named itself.
    where = landing.shown or str(json.loads(body).get("path", path))
    written: dict[str, object] = {"name": posixpath.basename(where), "type": "file", "path": where}
    if metadata:
        written["metadata"] = metadata
    return written


async def upload(execd: Execd, request: Request, user: str, *, only: str | None = None) -> Response:
    """``only``: every file goes to this path (a signed URL's), whatever its part's file name says."""
    content_type = request.headers.get("content-type", "")
    query_path = request.query_params.get("path")
    written: list[dict[str, object]] = []
    seen: set[str] = set()  # the paths written, as given and as resolved
    metadata = upload_metadata(request)
    if content_type.split(";", 1)[0].strip().lower() == "multipart/form-data":
        reader = MultipartReader(request.stream(), boundary_of(content_type))
        async for headers in reader.parts():
            params = disposition(headers)
            target = only or params.get("filename") or query_path
            if params.get("name") != "file" or not target:
                async for _ in reader.body():  # not a file: skipped
                    pass
                continue
            if target in seen:  # envd refuses it too, after writing the first
                raise HttpFailure(400, f"{target}: one upload cannot write a path twice (only its first file was)")
            written.append(await _write(execd, target, user, reader.body(), metadata))
            seen.update((target, str(written[-1]["path"])))
    else:
        if not query_path:
            raise HttpFailure(400, "path: required for an application/octet-stream upload")
        stream: AsyncIterator[bytes] = request.stream()
        if request.headers.get("content-encoding", "").lower() == "gzip":
            stream = _gunzip(stream)
        written.append(await _write(execd, query_path, user, stream, metadata))
    if not written:
        raise HttpFailure(400, "no file in the upload")
    return JSONResponse(written)
