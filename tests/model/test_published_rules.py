"""What the published schema allows, the server accepts (issue 17: schemathesis found schema-valid requests
refused): the schema-side forms of the model's rules, checked against the validators themselves."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adx.errors import InvalidInputError
from adx.model import EnvironmentSpec, NetworkPolicy, parse_wire
from adx.model._network import TARGET_SCHEMA_PATTERN


@settings(max_examples=300)
@given(st.from_regex(TARGET_SCHEMA_PATTERN, fullmatch=True).filter(lambda s: len(s) <= 253))
def test_every_target_the_schema_allows_is_accepted(target: str) -> None:
    policy = parse_wire(NetworkPolicy, {"mode": "egress", "allow": [target]})
    assert policy.allow is not None and len(policy.allow) == 1


@pytest.mark.parametrize("target", ["", "123", "-a.com", "a..b", "256.0.0.1", "10.0.0.0/33", "a b"])
def test_targets_outside_the_schema_are_refused(target: str) -> None:
    assert not re.fullmatch(TARGET_SCHEMA_PATTERN, target)
    with pytest.raises(InvalidInputError, match=r"network\.allow\[0\]"):
        parse_wire(NetworkPolicy, {"mode": "egress", "allow": [target]}, root="network")


@pytest.mark.parametrize("value", [1, 1.0, 4096.0])
def test_a_whole_number_may_be_written_as_a_float(value: float) -> None:
    """JSON Schema's integer includes 4096.0; 1.5, "1" and true are still refused."""
    spec = parse_wire(EnvironmentSpec, {"resources": {"cpuMillis": value, "memoryBytes": 1}})
    assert spec.resources.cpu_millis == int(value)
    for bad in (1.5, "1", True):
        with pytest.raises(InvalidInputError, match=r"resources\.cpuMillis"):
            parse_wire(EnvironmentSpec, {"resources": {"cpuMillis": bad, "memoryBytes": 1}})


def test_the_spec_schema_states_the_request_rules() -> None:
    schema = EnvironmentSpec.model_json_schema(by_alias=True)
    resources = schema["properties"]["resources"]
    assert resources["properties"]["cpuMillis"] == {"minimum": 1} and "memoryBytes" in resources["required"]
    lifecycle = schema["$defs"]["Lifecycle"]
    assert lifecycle["if"]["properties"]["idleAction"] == {"const": "pause"}
    assert lifecycle["then"]["properties"]["idleTimeoutSeconds"] == {"minimum": 1}
    assert len(schema["$defs"]["HealthProbe"]["oneOf"]) == 2
