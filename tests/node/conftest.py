"""Fixtures of the node tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from process_cluster import ProcessCluster, start_process_cluster

from adx.embedded import EmbeddedRedis


@pytest.fixture
async def process_cluster(redis_factory: Callable[..., EmbeddedRedis], tmp_path: Path) -> Any:
    from sbx_helpers import DaemonFactory

    (tmp_path / "sandboxd").mkdir()
    factory = DaemonFactory(tmp_path / "sandboxd")
    made: list[ProcessCluster] = []

    def make(**kwargs: Any) -> ProcessCluster:
        cluster = start_process_cluster(tmp_path, redis_factory(), factory, **kwargs)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.stop()
        for node in cluster.nodes.values():
            print(f"--- {node.name} log tail ---\n{node.adxlet.log_tail(40)}")
    factory.cleanup()
