"""Building an Environment spec from the SDK's keyword arguments, validated before any request.

The wire form and its checks are ``adx.model.EnvironmentSpec`` (the same model the server validates with);
errors are reported under the SDK's own argument names (``cpu``, ``memory``, ``idle_action``...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict, Unpack, cast

from adx.errors import InvalidInputError
from adx.model import (
    CheckpointStorage,
    EnvironmentSpec,
    IdleAction,
    Lifecycle,
    NetworkPolicy,
    PauseOptions,
    RetentionPolicy,
    Volume,
    parse_bytes,
    parse_cpu_millis,
    parse_wire,
)
from adx.model import RestartPolicy as _RestartPolicy
from adx.sdk._models import check_keywords
from adx.sdk._volumes import volumes_body

# A pause call's HTTP timeout beyond the capture's own bound: freeze, publish, commit and stop.
PAUSE_OVERHEAD_SECONDS = 60.0
# A resume call's HTTP timeout: the API server waits up to its wake_timeout_seconds (default 60) for the resume.
RESUME_TIMEOUT_SECONDS = 180.0


def sdk_field(wire_path: str) -> str:
    for prefix, name in _ARGUMENTS:
        if wire_path == prefix or wire_path.startswith(prefix + "."):
            return name + wire_path[len(prefix) :]
    return wire_path


def _checked(model: type[Any], root: str, data: dict[str, Any]) -> dict[str, Any]:
    """Validate with the model's own rules first, so a bad value is an InvalidInputError naming the field
    (the SDK depends on adx.model and adx.errors only, never on the validation library underneath)."""
    parse_wire(model, data, root)
    return data


class PausePolicy(PauseOptions):
    """How an Environment is paused (ENV-3): ``adx.PausePolicy(retention=adx.Retention.ttl(3600),
    storage=adx.CheckpointStorage.LOCAL, timeout_seconds=300)``. Invalid values raise InvalidInputError."""

    def __init__(
        self,
        *,
        retention: RetentionPolicy | None = None,
        timeout_seconds: int = 300,
        storage: CheckpointStorage | str = CheckpointStorage.CONFIGURED,
    ) -> None:
        data: dict[str, Any] = {"timeout_seconds": timeout_seconds, "storage": storage}
        if retention is not None:
            data["retention"] = retention
        super().__init__(**_checked(PauseOptions, "pause", data))


class RestartPolicy(_RestartPolicy):
    """Restart on exit or failure with exponential backoff (RST-2): ``adx.RestartPolicy(max_retries=3)``."""

    def __init__(
        self, *, max_retries: int = 3, initial_backoff_seconds: float = 1.0, max_backoff_seconds: float = 60.0
    ) -> None:
        data = {
            "max_retries": max_retries,
            "initial_backoff_seconds": initial_backoff_seconds,
            "max_backoff_seconds": max_backoff_seconds,
        }
        super().__init__(**_checked(_RestartPolicy, "restart", data))


class Retention:
    """A checkpoint's retention: ``Retention.ttl(3600)`` (seconds from publication) or ``Retention.forever()``."""

    @staticmethod
    def ttl(seconds: int = 90_000) -> RetentionPolicy:
        return parse_wire(RetentionPolicy, {"kind": "ttl", "ttl_seconds": seconds}, "retention")

    @staticmethod
    def forever() -> RetentionPolicy:
        return RetentionPolicy(kind="forever")


def _whole_seconds(field: str, value: object) -> object:
    # 300.0 means 300; anything else goes to the model's strict check and is refused there.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool):
        raise InvalidInputError(field, "must be a whole number of seconds, not a boolean")
    return value


def _action(field: str, value: IdleAction | str) -> str:
    try:
        return IdleAction(value).value
    except ValueError:
        choices = ", ".join(a.value for a in IdleAction)
        raise InvalidInputError(field, f"must be one of {choices}, got {value!r}") from None


class LifetimeBody(TypedDict, total=False):
    seconds: object  # whole seconds (checked below with the spec's own rule)
    action: str  # an IdleAction's value


def lifetime_body(seconds: float, action: IdleAction | str | None = None) -> LifetimeBody:
    """The body of ``POST /v1/environments/{id}/lifetime``, checked with the spec's own lifetime rules
    (whole seconds, 1 s to 30 days); errors name ``seconds`` / ``action``."""
    body: LifetimeBody = {"seconds": _whole_seconds("seconds", seconds)}
    if action is not None:
        body["action"] = _action("action", action)
    try:
        parse_wire(Lifecycle, {"lifetimeSeconds": body["seconds"]})
    except InvalidInputError as exc:
        raise InvalidInputError("seconds", exc.reason) from None
    return body


def network_body(
    mode: str = "egress", allow: Sequence[str] | None = None, deny: Sequence[str] | None = None
) -> dict[str, object]:
    """A network policy's camelCase body: ``mode`` "none" or "egress"; ``allow`` (only these, plus DNS) and
    ``deny`` (wins over allow) are CIDRs or DNS names, resolved by the node when the policy is applied."""
    if isinstance(allow, str) or isinstance(deny, str):
        raise InvalidInputError("network", "allow and deny must be lists of CIDRs or DNS names, not a string")
    body: dict[str, object] = {"mode": mode}
    if allow is not None:
        body["allow"] = list(allow)
    if deny is not None:
        body["deny"] = list(deny)
    return parse_wire(NetworkPolicy, body, root="network").to_wire()


def pause_call_timeout(lifecycle: Lifecycle, floor: float) -> float:
    """How long a pause call may take: the capture's own bound (``pauseOptions.timeoutSeconds``) plus what
    freezing, publishing and stopping add; never shorter than the client's ``floor``."""
    return max(floor, lifecycle.effective_pause_options.timeout_seconds + PAUSE_OVERHEAD_SECONDS)


def _as_is(field: str, value: object) -> object:
    return value


def _policy(model: type[PauseOptions | _RestartPolicy], name: str) -> Callable[[str, object], object]:
    def wire(field: str, value: object) -> object:
        if not isinstance(value, model):
            raise InvalidInputError(field, f"must be an {name}, got {type(value).__name__}")
        return value.to_wire()

    return wire


def _argv(field: str, value: object) -> object:
    if isinstance(value, str):
        raise InvalidInputError(field, "must be a list of arguments (argv), not a string")
    return list(cast(Sequence[str], value))


def _mapping(field: str, value: object) -> object:
    return dict(cast(Mapping[str, Any], value))


#: SDK argument -> lifecycle wire field, and how its value becomes the wire's (in the order errors are found).
_LIFECYCLE: list[tuple[str, str, Callable[[str, Any], object]]] = [
    ("idle_timeout", "idleTimeoutSeconds", _whole_seconds),
    ("idle_action", "idleAction", _action),
    ("pause", "pauseOptions", _policy(PauseOptions, "adx.PausePolicy")),
    ("restart", "restartPolicy", _policy(_RestartPolicy, "adx.RestartPolicy")),
    ("execd_health_failure_threshold", "execdHealthFailureThreshold", _as_is),
    ("lifetime", "lifetimeSeconds", _whole_seconds),
    ("lifetime_action", "lifetimeAction", _action),
]
#: The spec's other fields, whose wire names are the arguments' own.
_TOP_LEVEL: list[tuple[str, Callable[[str, Any], object]]] = [
    ("image", _as_is),
    ("entrypoint", _argv),
    ("env", _mapping),
    ("metadata", _mapping),
    ("network", _mapping),
    ("volumes", lambda _, value: volumes_body(value)),
]
#: Wire path prefix -> SDK argument name, for errors the model finds (a bare "lifecycle" last: model-level
#: lifecycle checks are about the idle action and its window).
_ARGUMENTS = [
    ("resources.cpuMillis", "cpu"),
    ("resources.memoryBytes", "memory"),
    ("resources.diskBytes", "disk"),
    *((f"lifecycle.{wire}", name) for name, wire, _ in _LIFECYCLE),
    ("lifecycle", "idle_action"),
]


class SpecArgs(TypedDict, total=False):
    """An Environment's spec as keyword arguments: ``environments.create(**)`` and ``build_spec(**)`` take these
    (each may be None: unset)."""

    cpu: float | str  # cores, or millicores "500m" (default 1)
    memory: int | str  # bytes, or "512Mi" (the default)
    disk: int | str | None
    image: str | None
    entrypoint: Sequence[str] | None
    idle_timeout: float | None
    idle_action: IdleAction | str | None
    pause: PauseOptions | None
    restart: _RestartPolicy | None
    execd_health_failure_threshold: int | None
    lifetime: float | None
    lifetime_action: IdleAction | str | None
    env: Mapping[str, str] | None
    metadata: Mapping[str, str] | None
    network: Mapping[str, Any] | None  # network_body(...)
    volumes: Mapping[str, str | Volume] | None


def build_spec(**args: Unpack[SpecArgs]) -> dict[str, Any]:
    """The camelCase spec for ``POST /v1/environments``; InvalidInputError names the SDK argument."""
    check_keywords("build_spec", args, SpecArgs)
    disk = args.get("disk")
    resources = {
        "cpuMillis": parse_cpu_millis("cpu", args.get("cpu", 1)),
        "memoryBytes": parse_bytes("memory", args.get("memory", "512Mi")),
        "diskBytes": parse_bytes("disk", disk) if disk is not None else 0,
    }
    lifecycle: dict[str, object] = {}
    for name, wire, convert in _LIFECYCLE:
        value = args.get(name)
        if value is not None:
            lifecycle[wire] = convert(name, value)
    spec: dict[str, object] = {"resources": resources, "lifecycle": lifecycle}
    for name, convert in _TOP_LEVEL:
        value = args.get(name)
        if value is not None:
            spec[name] = convert(name, value)
    try:
        parse_wire(EnvironmentSpec, spec)
    except InvalidInputError as exc:
        raise InvalidInputError(sdk_field(exc.field), exc.reason) from None
    return spec
