"""Domain model: spec validation (ENV-1/2/3/5), resource arithmetic (RES-4), states, backoff (RST-2)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

import adx.model
from adx.errors import ConflictError, InvalidInputError
from adx.model import (
    ALLOWED_TRANSITIONS,
    MAX_QUANTITY,
    CheckpointStorage,
    EnvironmentSpec,
    EnvironmentState,
    IdleAction,
    Lifecycle,
    PauseOptions,
    Resources,
    RestartPolicy,
    Retention,
    allocatable,
    check_id,
    check_transition,
    new_id,
    parse_bytes,
    parse_cpu_millis,
    parse_wire,
)

OK_RESOURCES = {"cpuMillis": 500, "memoryBytes": 256 * 2**20}


def spec(**extra: Any) -> dict[str, Any]:
    return {"resources": dict(OK_RESOURCES), **extra}


@pytest.mark.req("ENV-1")
def test_lifecycle_wire_names_are_camel_case_and_round_trip() -> None:
    wire = spec(
        lifecycle={
            "idleTimeoutSeconds": 60,
            "idleAction": "pause",
            "pauseOptions": {
                "retention": {"kind": "ttl", "ttlSeconds": 3600},
                "timeoutSeconds": 30,
                "storage": "local",
            },
            "restartPolicy": {"maxRetries": 5, "initialBackoffSeconds": 2, "maxBackoffSeconds": 30},
            "execdHealthFailureThreshold": 3,
        }
    )
    parsed = parse_wire(EnvironmentSpec, wire)
    assert parsed.lifecycle.idle_action is IdleAction.PAUSE
    assert parsed.lifecycle.pause_options == PauseOptions(
        retention=Retention.ttl(3600), timeout_seconds=30, storage=CheckpointStorage.LOCAL
    )
    assert parse_wire(EnvironmentSpec, parsed.to_wire()) == parsed
    assert set(parsed.to_wire()["lifecycle"]) == {  # type: ignore[arg-type]
        "idleTimeoutSeconds",
        "idleAction",
        "pauseOptions",
        "restartPolicy",
        "execdHealthFailureThreshold",
        "lifetimeSeconds",
        "lifetimeAction",
        "healthProbe",
        "wakeOnTraffic",
    }


@pytest.mark.req("ENV-1", "ENV-3", "RST-6")
def test_lifecycle_defaults() -> None:
    lifecycle = parse_wire(EnvironmentSpec, spec()).lifecycle
    assert lifecycle.idle_action is IdleAction.DELETE
    assert lifecycle.idle_timeout_seconds == 0
    assert lifecycle.restart_policy is None and lifecycle.execd_health_failure_threshold is None
    options = lifecycle.effective_pause_options
    assert options.to_wire() == {
        "retention": {"kind": "ttl", "ttlSeconds": 90000},
        "timeoutSeconds": 300,
        "storage": "configured",
    }


@pytest.mark.req("ENV-3")
def test_retention_forever_has_no_ttl() -> None:
    assert Retention.forever().to_wire() == {"kind": "forever"}
    with pytest.raises(InvalidInputError) as caught:
        parse_wire(PauseOptions, {"retention": {"kind": "forever", "ttlSeconds": 5}})
    assert caught.value.field == "retention"


@pytest.mark.req("ENV-2")
def test_pause_needs_positive_idle_timeout() -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse_wire(EnvironmentSpec, spec(lifecycle={"idleAction": "pause", "idleTimeoutSeconds": 0}))
    assert caught.value.field == "lifecycle"
    assert "positive idleTimeoutSeconds" in caught.value.reason
    assert Lifecycle(idle_action=IdleAction.PAUSE, idle_timeout_seconds=1).idle_action is IdleAction.PAUSE


@pytest.mark.req("ENV-3")
@pytest.mark.parametrize("timeout", [0, 3601, -1, 1.5, "10"])
def test_pause_timeout_range(timeout: object) -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse_wire(PauseOptions, {"timeoutSeconds": timeout})
    assert caught.value.field == "timeoutSeconds"


@pytest.mark.req("ENV-5")
@pytest.mark.parametrize(
    ("resources", "field"),
    [
        ({"cpuMillis": 0, "memoryBytes": 1}, "resources.cpuMillis"),
        ({"cpuMillis": -5, "memoryBytes": 1}, "resources.cpuMillis"),
        ({"cpuMillis": 1, "memoryBytes": 0}, "resources.memoryBytes"),
        ({"cpuMillis": 1, "memoryBytes": -1}, "resources.memoryBytes"),
        ({"cpuMillis": 1, "memoryBytes": 2**63}, "resources.memoryBytes"),
        ({"cpuMillis": 10**30, "memoryBytes": 1}, "resources.cpuMillis"),
        ({"cpuMillis": "100", "memoryBytes": 1}, "resources.cpuMillis"),
        ({"cpuMillis": 1.5, "memoryBytes": 1}, "resources.cpuMillis"),
        ({"cpuMillis": True, "memoryBytes": 1}, "resources.cpuMillis"),
        ({"cpuMillis": None, "memoryBytes": 1}, "resources.cpuMillis"),
        ({"cpuMillis": 1, "memoryBytes": 1, "diskBytes": -1}, "resources.diskBytes"),
        ({"cpuMillis": 1, "memoryBytes": 1, "gpus": 1}, "resources.gpus"),
    ],
)
def test_bad_resource_numbers_name_the_field(resources: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse_wire(EnvironmentSpec, {"resources": resources})
    assert caught.value.field == field


@pytest.mark.req("ENV-5")
def test_bad_spec_fields_name_the_field() -> None:
    cases = [
        (spec(entrypoint=[]), "entrypoint"),
        (spec(entrypoint=["a\x00b"]), "entrypoint"),
        (spec(env={"1BAD": "x"}), "env"),
        (spec(image="Not/An/Image"), "image"),
        (spec(lifecycle={"restartPolicy": {"maxRetries": -1}}), "lifecycle.restartPolicy.maxRetries"),
        (spec(lifecycle={"idleTimeoutSeconds": -1}), "lifecycle.idleTimeoutSeconds"),
        (spec(extra=1), "extra"),
        ({}, "resources"),
    ]
    for data, field in cases:
        with pytest.raises(InvalidInputError) as caught:
            parse_wire(EnvironmentSpec, data)
        assert caught.value.field == field, (data, caught.value)


@pytest.mark.req("ENV-5")
@given(st.one_of(st.integers(), st.floats(), st.text(max_size=12), st.booleans(), st.none()))
def test_any_cpu_value_is_accepted_only_as_a_positive_int(value: object) -> None:
    data = {"resources": {"cpuMillis": value, "memoryBytes": 1}}
    # A JSON integer: an int, or a whole float (JSON Schema's integer includes 126.0); never a bool or a string.
    whole = type(value) is int or (type(value) is float and value.is_integer())
    good = whole and 0 < value <= MAX_QUANTITY  # type: ignore[operator]
    if good:
        assert parse_wire(EnvironmentSpec, data).resources.cpu_millis == int(value)  # type: ignore[call-overload]
    else:
        with pytest.raises(InvalidInputError):
            parse_wire(EnvironmentSpec, data)


@pytest.mark.parametrize(
    ("text", "expected"),
    [(1, 1), ("512Mi", 512 * 2**20), ("2G", 2 * 10**9), ("1.5Ki", 1536), ("1048576", 2**20), ("0", 0)],
)
def test_parse_bytes(text: object, expected: int) -> None:
    assert parse_bytes("memory", text) == expected


@pytest.mark.parametrize("text", ["-1", "1.5", "12Q", "Mi", "", "1e3", math.inf, True, [1], "9" * 30])
def test_parse_bytes_rejects(text: object) -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse_bytes("memory", text)
    assert caught.value.field == "memory"


@pytest.mark.parametrize(("text", "expected"), [(1, 1000), (0.5, 500), ("1.5", 1500), ("250m", 250), ("0.001", 1)])
def test_parse_cpu(text: object, expected: int) -> None:
    assert parse_cpu_millis("cpu", text) == expected


@pytest.mark.parametrize("text", ["-1", "0.0001", "abc", "1.5m", math.nan, False, "1e400"])
def test_parse_cpu_rejects(text: object) -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse_cpu_millis("cpu", text)
    assert caught.value.field == "cpu"


quantities = st.integers(min_value=0, max_value=MAX_QUANTITY)
resources = st.builds(Resources, cpu_millis=quantities, memory_bytes=quantities, disk_bytes=quantities)


@pytest.mark.req("RES-4")
@given(resources, resources)
def test_allocatable_is_capacity_minus_reserved_floored_at_zero(capacity: Resources, reserved: Resources) -> None:
    free = allocatable(capacity, reserved)
    assert free.cpu_millis == max(capacity.cpu_millis - reserved.cpu_millis, 0)
    assert free.memory_bytes == max(capacity.memory_bytes - reserved.memory_bytes, 0)
    assert free.disk_bytes == max(capacity.disk_bytes - reserved.disk_bytes, 0)


@pytest.mark.req("RES-4", "RES-6")
def test_zero_capacity_admits_only_zero_requests() -> None:
    zero = Resources()
    assert Resources(disk_bytes=0, cpu_millis=0, memory_bytes=0).fits_within(zero)
    request = Resources(cpu_millis=1, memory_bytes=1)
    assert not request.fits_within(zero)
    assert request.shortfall(Resources(cpu_millis=5)) == ["memory"]
    # Zero disk capacity still matches a request without disk.
    assert request.fits_within(Resources(cpu_millis=1, memory_bytes=1, disk_bytes=0))


@pytest.mark.req("RST-2")
def test_restart_backoff_is_exponential_and_capped() -> None:
    policy = RestartPolicy(max_retries=10, initial_backoff_seconds=1, max_backoff_seconds=20)
    assert [policy.backoff_seconds(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 20, 20]
    assert policy.backoff_seconds(10_000) == 20
    assert policy.allows(9) and not policy.allows(10)
    with pytest.raises(ValueError):
        policy.backoff_seconds(0)
    # The cap wins from the first delay: a maximum below the initial delay is valid (schemathesis sent one; it
    # was refused although the published schema allowed it).
    capped = parse_wire(RestartPolicy, {"initialBackoffSeconds": 10, "maxBackoffSeconds": 2})
    assert [capped.backoff_seconds(n) for n in (1, 2, 5)] == [2, 2, 2]


def test_transitions_are_checked() -> None:
    check_transition(EnvironmentState.RUNNING, EnvironmentState.PAUSING)
    with pytest.raises(ConflictError, match="cannot go from deleted to running"):
        check_transition(EnvironmentState.DELETED, EnvironmentState.RUNNING)
    with pytest.raises(ConflictError, match="cannot go from paused to running"):
        check_transition(EnvironmentState.PAUSED, EnvironmentState.RUNNING, env_id="env-x")
    assert set(ALLOWED_TRANSITIONS) == set(EnvironmentState)
    # Every state but deleted can reach deleting or deleted: a delete is always possible.
    for state, targets in ALLOWED_TRANSITIONS.items():
        if state is not EnvironmentState.DELETED:
            assert targets & {EnvironmentState.DELETING, EnvironmentState.DELETED}, state


def test_state_compares_equal_to_its_string() -> None:
    assert EnvironmentState.RUNNING == "running"


def test_ids() -> None:
    first, second = new_id("env"), new_id("env")
    assert first != second and first.startswith("env-") and len(first) == 30
    assert check_id("id", first, "env") == first
    for bad in (second.replace("env", "exe"), "env-short", 5, "env-" + "A" * 26):
        with pytest.raises(InvalidInputError):
            check_id("id", bad, "env")


def test_public_exports_are_honest() -> None:
    for name in adx.model.__all__:
        assert hasattr(adx.model, name), name


@pytest.mark.parametrize("value", [0, 1, "true", "no", 1.0])
def test_wake_on_traffic_takes_only_a_json_boolean(value: object) -> None:
    """The published schema says boolean: a number or a string is refused naming the field (schemathesis found
    ``"wakeOnTraffic": 0`` accepted as false)."""
    with pytest.raises(ValidationError) as info:
        Lifecycle.model_validate({"wakeOnTraffic": value})
    assert "wakeOnTraffic" in str(info.value)
