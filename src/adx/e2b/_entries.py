"""envd's ``EntryInfo`` (proto3 JSON) from execd's description of an entry: what ``Stat``, ``ListDir``, ``MakeDir``,
``Move`` answer and what a watch event started with ``include_entry`` carries."""

from __future__ import annotations

import posixpath
import stat
from datetime import UTC, datetime

from adx.e2b._files import metadata_of
from adx.model import FileEntry, FileType

_TYPES = {"file": "FILE_TYPE_FILE", "directory": "FILE_TYPE_DIRECTORY", "symlink": "FILE_TYPE_SYMLINK"}
_TYPE_BITS = {"file": stat.S_IFREG, "directory": stat.S_IFDIR, "symlink": stat.S_IFLNK}


def timestamp(seconds: float) -> str:
    """google.protobuf.Timestamp in its JSON form (RFC 3339, UTC)."""
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{moment.microsecond:06d}Z"


def entry_info(path: str, described: FileEntry) -> dict[str, object]:
    """execd's entry (``adx.model.FileEntry``) as envd's EntryInfo (proto3 JSON)."""
    kind = described.type.value
    entry: dict[str, object] = {
        "name": described.name or posixpath.basename(path) or "/",  # envd's name of the root is "/"
        "type": _TYPES.get(kind, "FILE_TYPE_UNSPECIFIED"),
        "path": path,
        "size": str(described.size),  # int64: a string in proto3 JSON
        "mode": described.mode,
        "permissions": stat.filemode(_TYPE_BITS.get(kind, 0) | described.mode),
        "owner": described.owner or "",
        "group": described.group or "",
        "modifiedTime": timestamp(described.mtime),
    }
    if metadata := metadata_of(described):
        entry["metadata"] = metadata
    if described.type is FileType.SYMLINK:
        # As newer envd: ``type`` is what the link resolves to, ``isSymlink`` marks the link itself.
        resolved = described.target_type.value if described.target_type is not None else ""
        entry["type"] = _TYPES.get(resolved, "FILE_TYPE_SYMLINK")
        entry["isSymlink"] = True
        if described.target:
            entry["symlinkTarget"] = described.target
    return entry
