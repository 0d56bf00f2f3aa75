"""A component's configuration becomes the runtime's option dataclasses field by field (same names)."""

from __future__ import annotations

import pytest

from adx.agents import AgentMaintenanceOptions, AgentWorkerOptions, DurableGraphDriverOptions
from adx.agents._config import AgentMaintenanceConfig, AgentWorkerConfig
from adx.agents._options import options_from
from adx.errors import InvalidInputError

URL = "postgresql://adx@127.0.0.1:5432/adx"


def worker_config(**fields: object) -> AgentWorkerConfig:
    return AgentWorkerConfig.model_validate({"database_url": URL, "registrations": "app", **fields})


def test_driver_options_take_the_configured_values_and_keep_their_own_defaults() -> None:
    cfg = worker_config(lease_seconds=7.5, node_timeout_seconds=9.0, max_node_attempts=2, max_nodes_per_claim=3)
    options = options_from(DurableGraphDriverOptions, cfg, environments=None)
    assert options == DurableGraphDriverOptions(
        lease_seconds=7.5, node_timeout_seconds=9.0, max_node_attempts=2, max_nodes_per_claim=3
    )
    # The configuration's own `environments` (an AgentEnvironmentsConfig) never reaches the driver as such.
    assert options.environments is None


def test_given_values_override_the_configuration() -> None:
    cfg = worker_config(slots=6, drain_seconds=4.0, idle_poll_seconds=0.25, liveness_grace_seconds=0)
    options = options_from(AgentWorkerOptions, cfg, liveness_grace_seconds=cfg.liveness_grace_seconds or None)
    assert (options.slots, options.drain_seconds, options.idle_poll_seconds) == (6, 4.0, 0.25)
    assert options.liveness_grace_seconds is None
    assert options.tick_deadline_seconds == cfg.tick_deadline_seconds
    assert options.error_backoff_seconds == AgentWorkerOptions().error_backoff_seconds  # not configurable


def test_maintenance_options_are_the_configured_ones() -> None:
    cfg = AgentMaintenanceConfig.model_validate(
        {"database_url": URL, "tenants": ["t1"], "interval_seconds": 2.0, "tick_limit_seconds": 5.0, "page_size": 7}
    )
    assert options_from(AgentMaintenanceOptions, cfg) == AgentMaintenanceOptions(
        interval_seconds=2.0, error_interval_seconds=cfg.error_interval_seconds, tick_limit_seconds=5.0, page_size=7
    )


def test_the_options_still_check_what_they_are_given() -> None:
    with pytest.raises(InvalidInputError) as err:
        options_from(AgentWorkerOptions, worker_config(), liveness_grace_seconds=7200.0)
    assert err.value.field == "liveness_grace_seconds"
