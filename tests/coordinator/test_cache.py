"""The Coordinator's in-memory caches: the wire forms InspectNode serves (issue 16)."""

from __future__ import annotations

import json

from test_service import new_record

from adx.coordinator._cache import CoordinatorCache
from adx.model import EnvironmentState


def test_a_records_wire_form_is_made_once_per_version_and_follows_every_commit() -> None:
    cache = CoordinatorCache()
    first = new_record("n1")
    cache.apply(first)
    (wire,) = cache.node_catalog_wire("n1")
    assert json.loads(wire) == first.to_wire()
    # Unchanged: the same text object, not a new serialisation.
    assert cache.node_catalog_wire("n1")[0] is wire

    committed = first.model_copy(update={"state": EnvironmentState.PAUSING, "revision": 2})
    cache.apply(committed)
    (after,) = cache.node_catalog_wire("n1")
    assert json.loads(after) == committed.to_wire()

    # Even a record put in the cache without apply() is never answered with another version's form.
    same_revision = committed.model_copy(update={"last_error": "replaced in place"})
    cache.environments[committed.id] = same_revision
    assert json.loads(cache.node_catalog_wire("n1")[0])["lastError"] == "replaced in place"


def test_an_older_version_neither_replaces_the_record_nor_its_wire_form() -> None:
    cache = CoordinatorCache()
    newer = new_record("n1").model_copy(update={"revision": 5, "state": EnvironmentState.PAUSED})
    cache.apply(newer)
    (wire,) = cache.node_catalog_wire("n1")
    cache.apply(newer.model_copy(update={"revision": 4, "state": EnvironmentState.RUNNING}))
    assert cache.node_catalog_wire("n1") == [wire]
    assert json.loads(wire)["state"] == "paused"


def test_a_deleted_record_leaves_the_catalog_and_its_wire_form_is_dropped() -> None:
    cache = CoordinatorCache()
    kept, gone = new_record("n1"), new_record("n1")
    cache.apply(kept)
    cache.apply(gone)
    assert len(cache.node_catalog_wire("n1")) == 2
    cache.apply(gone.model_copy(update={"state": EnvironmentState.DELETED, "revision": 2}))
    assert [json.loads(w)["id"] for w in cache.node_catalog_wire("n1")] == [kept.id]
    assert gone.id not in cache._wire
