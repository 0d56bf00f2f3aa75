"""E2B's control-plane answers as typed objects, named and spelled as the SDK's ``e2b.api.client.models`` read
them (``Sandbox``, ``ListedSandbox`` / ``SandboxDetail``, ``SandboxMetric``, ``VolumeAndToken``,
``VolumeEntryStat``, ``TemplateBuildInfo``).

Each serialises to exactly the JSON the routes wrote by hand before: fields in E2B's order, and a field that a
view does not carry (the detail-only ones in a list entry, a step no entry names) absent rather than null
(``exclude_unset``: a field is sent when it was given, even as null).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

__all__ = [
    "BuildLogEntry",
    "BuildStatusReason",
    "CreatedSandbox",
    "SandboxLifecycle",
    "SandboxMetric",
    "SandboxState",
    "SandboxView",
    "TemplateBuildInfo",
    "VolumeAndToken",
    "VolumeEntryStat",
    "wire",
]

#: A sandbox's state as E2B knows it (one that is going or gone is no sandbox to E2B).
SandboxState = Literal["running", "paused"]


def _e2b_name(field: str) -> str:
    """E2B's JSON name: camelCase with ``ID`` and ``MB`` in capitals (``sandboxID``, ``memoryMB``)."""
    return re.sub(r"(Id|Mb)$", lambda m: m[0].upper(), to_camel(field))


class _View(BaseModel):
    model_config = ConfigDict(alias_generator=_e2b_name, populate_by_name=True, frozen=True)


def wire(view: BaseModel) -> dict[str, object]:
    """The view as the SDK reads it: E2B's names, the fields this answer sets."""
    return view.model_dump(mode="json", by_alias=True, exclude_unset=True)


class CreatedSandbox(_View):
    """``Sandbox``: the answer of a create, a connect and each fork."""

    template_id: str
    sandbox_id: str
    client_id: str
    envd_version: str
    envd_access_token: str
    domain: str


class SandboxLifecycle(_View):
    on_timeout: Literal["pause", "kill"]
    auto_resume: bool


class SandboxView(_View):
    """``ListedSandbox`` (a list entry), and with the detail fields set ``SandboxDetail`` (``get_info``)."""

    template_id: str
    sandbox_id: str
    client_id: str
    started_at: str
    end_at: str
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    state: SandboxState | None
    envd_version: str
    metadata: dict[str, str]
    alias: str  # the template's name: the SDK's ``SandboxInfo.name``
    # SandboxDetail only:
    envd_access_token: str | None = None
    domain: str | None = None
    lifecycle: SandboxLifecycle | None = None
    allow_internet_access: bool | None = None
    network: dict[str, list[str]] | None = None


class SandboxMetric(_View):
    timestamp: str
    timestamp_unix: int
    cpu_count: int
    cpu_used_pct: float
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int


class VolumeAndToken(_View):
    """A volume with its content token (create, get)."""

    volume_id: str
    name: str
    token: str


class VolumeEntryStat(_View):
    name: str
    type: str  # directory, file, symlink, unknown
    path: str
    size: int
    mode: int
    uid: int
    gid: int
    atime: str
    mtime: str
    ctime: str
    target: str | None = None  # a symlink's only


class BuildLogEntry(_View):
    timestamp: str
    level: str
    message: str
    step: str | None = None  # E2B's step name, where the entry belongs to one


class BuildStatusReason(_View):
    message: str
    log_entries: list[BuildLogEntry]
    step: str | None = None


class TemplateBuildInfo(_View):
    template_id: str
    build_id: str
    status: str
    log_entries: list[BuildLogEntry]
    logs: list[str]
    reason: BuildStatusReason | None = None
