"""E2B's control-plane request bodies as typed objects, named as the SDK's ``e2b.api.client.models`` name them.

A body is read by :func:`body_as` from the request's JSON object; each field is checked with the reason an E2B
user sees (``400: timeout: must be ...``). Bodies whose fields E2B's API states exactly refuse another one by
name (``extra="forbid"``); the ones the SDK may grow keep ignoring what they do not read, as before.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictStr
from starlette.requests import Request

from adx.errors import InvalidInputError
from adx.gateway import plane, read_json
from adx.model import parse_wire

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "FORK_TIMEOUT_SECONDS",
    "MAX_FORKS",
    "MAX_TIMEOUT_SECONDS",
    "AssignTemplateTags",
    "ConnectSandbox",
    "DeleteTemplateTags",
    "NewSandbox",
    "NewVolume",
    "PatchVolumecontentVolumeIdPathBody",
    "SandboxForkRequest",
    "SandboxSnapshotRequest",
    "SandboxTimeoutRequest",
    "TemplateBuildRequestV3",
    "body_as",
    "body_of",
    "seconds",
]

B = TypeVar("B", bound=BaseModel)
DEFAULT_TIMEOUT_SECONDS = 300
MAX_TIMEOUT_SECONDS = 30 * 86_400  # an Environment's longest lifetime (Lifecycle.lifetime_seconds)
#: E2B's fork limits and default lifetime of a fork (its API's ``SandboxForkRequest``).
MAX_FORKS = 20
FORK_TIMEOUT_SECONDS = 15


def seconds(value: object, *, allow_zero: bool = False) -> int:
    """A sandbox timeout in whole seconds: positive, at most MAX_TIMEOUT_SECONDS. ``allow_zero`` only changes
    what the refusal says (the caller that allows 0 handles it before: 'expire now')."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        wanted = "an integer >= 0" if allow_zero else "a positive integer"
        raise ValueError(f"must be {wanted} (seconds), got {value!r}")
    if value > MAX_TIMEOUT_SECONDS:  # said here, naming the SDK's field, not by the lifetime it becomes
        raise ValueError(f"must be at most {MAX_TIMEOUT_SECONDS} seconds (30 days), got {value}")
    return value


def _seconds_or_now(value: object) -> int:
    """``0`` is E2B's 'now' (the timeout counts from now); anything else is :func:`seconds`."""
    if value == 0 and not isinstance(value, bool):
        return 0
    return seconds(value, allow_zero=True)


def _forks(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_FORKS:
        raise ValueError(f"must be an integer from 1 to {MAX_FORKS}, got {value!r}")
    return value


def _string(value: object) -> object:
    if value is not None and not isinstance(value, str):
        raise ValueError("must be a string")
    return value


def _boolean(value: object) -> object:
    if value is not None and not isinstance(value, bool):
        raise ValueError("must be a boolean")
    return value


Seconds = Annotated[int, BeforeValidator(seconds)]


class _Exact(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class SandboxTimeoutRequest(_Lenient):
    """``POST /sandboxes/{id}/timeout``: the sandbox ends ``timeout`` seconds from now (0: at once)."""

    timeout: Annotated[int, BeforeValidator(_seconds_or_now)]


class ConnectSandbox(_Lenient):
    """``POST /sandboxes/{id}/connect``: a timeout to extend the sandbox's to (``memory`` is not read)."""

    timeout: Annotated[int | None, BeforeValidator(lambda value: None if value is None else seconds(value))] = None


class SandboxSnapshotRequest(_Exact):
    name: Annotated[str | None, BeforeValidator(_string)] = None
    memory: Annotated[bool | None, BeforeValidator(_boolean)] = None


class SandboxForkRequest(_Exact):
    timeout: Seconds = FORK_TIMEOUT_SECONDS
    count: Annotated[int, BeforeValidator(_forks)] = 1


def _required_string(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("required (a string)")
    return value


class NewVolume(_Exact):
    # Checked when absent too, so a missing name is refused with the same reason as one of another type.
    name: Annotated[str, BeforeValidator(_required_string)] = Field(default=None, validate_default=True)


def _object_or_none(value: object) -> object:
    if value is not None and not isinstance(value, dict):
        raise ValueError("must be a JSON object")
    return value


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be a boolean, got {value!r}")
    return value


def _template(value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError("required")
    return value


class SandboxAutoResumeConfig(_Lenient):
    """E2B's ``autoResume`` (the SDK's ``lifecycle={"auto_resume": ...}``): whether traffic wakes the sandbox once
    paused."""

    enabled: Annotated[bool, BeforeValidator(_flag)] = Field(default=None, validate_default=True)


class NewSandbox(_Exact):
    """``POST /v2/sandboxes``. The fields kept as ``object`` are checked by what they become (the Environment's
    spec and network policy, adx.e2b._network), which names them as E2B does."""

    # Absent: None, refused by the route naming templateID (a default's error would name the Python field).
    template_id: Annotated[str | None, BeforeValidator(_template)] = Field(default=None, alias="templateID")
    timeout: Seconds = DEFAULT_TIMEOUT_SECONDS
    auto_pause: Annotated[bool, BeforeValidator(_flag)] = Field(default=False, alias="autoPause")
    # Not said: traffic wakes a paused sandbox (ADX's rule, ENV-4).
    auto_resume: Annotated[SandboxAutoResumeConfig | None, BeforeValidator(_object_or_none)] = Field(
        default=None, alias="autoResume"
    )
    auto_pause_memory: object = Field(default=None, alias="autoPauseMemory")  # ADX keeps files, not memory
    metadata: object = None
    env_vars: object = Field(default=None, alias="envVars")
    secure: object = None  # every sandbox's envd calls carry a token
    allow_internet_access: object = None
    network: object = None
    mcp: object = None  # refused when given (not supported)
    iam: object = None  # refused when given (not supported)
    volume_mounts: object = Field(default=None, alias="volumeMounts")

    @property
    def wakes(self) -> bool:
        return self.auto_resume.enabled if self.auto_resume is not None else True


def _at_least(floor: int) -> BeforeValidator:
    def check(value: object) -> object:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < floor):
            raise ValueError(f"must be an integer >= {floor}, got {value!r}")
        return value

    return BeforeValidator(check)


class TemplateBuildRequestV3(_Exact):
    """``POST /v3/templates``: a template (by ``name``, or the older ``alias``) and its sandboxes' size."""

    name: Annotated[str | None, BeforeValidator(_string)] = None
    alias: Annotated[str | None, BeforeValidator(_string)] = None
    tags: list[str] | None = None
    team_id: object = Field(default=None, alias="teamID")  # the key's team is the tenant: not read
    cpu_count: Annotated[int | None, _at_least(1)] = Field(default=None, alias="cpuCount")
    memory_mb: Annotated[int | None, _at_least(128)] = Field(default=None, alias="memoryMB")
    min_free_disk_mb: Annotated[int | None, _at_least(0)] = Field(default=None, alias="minFreeDiskMb")


class AssignTemplateTags(_Exact):
    """``POST /templates/tags`` (``Template.assign_tags``): ``target`` is ``name[:tag]``, the build to tag."""

    target: Annotated[str, BeforeValidator(_string)]
    tags: list[StrictStr]


class DeleteTemplateTags(_Exact):
    """``DELETE /templates/tags`` (``Template.remove_tags``): a template's name (no tag) and the tags to drop."""

    name: Annotated[str, BeforeValidator(_string)]
    tags: list[StrictStr]


def _non_negative(value: object) -> object:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError("must be a non-negative integer")
    return value


NonNegative = Annotated[int | None, BeforeValidator(_non_negative)]


class PatchVolumecontentVolumeIdPathBody(_Exact):
    """``PATCH /volumecontent/{id}/path``: an entry's owner and permissions, each left as it is when not given."""

    uid: NonNegative = None
    gid: NonNegative = None
    mode: NonNegative = None


def body_as(model: type[B], body: Any) -> B:
    """The request's JSON value as ``model``; a wrong one is InvalidInputError naming the field (``body`` when it
    is not a JSON object)."""
    if not isinstance(body, dict):
        raise InvalidInputError("body", "must be a JSON object")
    return parse_wire(model, body)


async def body_of(request: Request, model: type[B], *, optional: bool = False) -> B:
    """The request's JSON body as ``model`` (``optional``: a JSON ``null`` is an empty object, every default)."""
    value = await read_json(request, plane(request).config.max_body_bytes)
    return body_as(model, {} if value is None and optional else value)
