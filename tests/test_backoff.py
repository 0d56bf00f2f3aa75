"""The one backoff helper behind every retry loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from adx._backoff import Backoff, capped_exponential
from adx.model import RestartPolicy
from adx.sdk._client import backoff as sdk_backoff


def test_delays_double_up_to_the_cap_and_reset() -> None:
    retry = Backoff(0.1, 0.5)
    assert [retry.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert retry.peek() == 0.5
    retry.reset()
    assert retry.next() == 0.1


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="0 < first <= cap"):
        Backoff(0, 1)
    with pytest.raises(ValueError, match="0 < first <= cap"):
        Backoff(2, 1)


def test_capped_exponential_is_the_same_sequence_and_never_overflows() -> None:
    assert [capped_exponential(0.2, 2.0, a) for a in range(6)] == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert capped_exponential(1.0, 60.0, 10_000) == 60.0
    assert [sdk_backoff(a) for a in range(3)] == [0.2, 0.4, 0.8]
    policy = RestartPolicy(initial_backoff_seconds=1, max_backoff_seconds=5)
    assert [policy.backoff_seconds(n) for n in (1, 2, 3, 4, 100)] == [1, 2, 4, 5, 5]


def test_sleep_waits_the_next_delay() -> None:
    retry = Backoff(0.05, 1.0)
    started = time.monotonic()
    asyncio.run(retry.sleep())
    assert time.monotonic() - started >= 0.05 and retry.peek() == 0.1
