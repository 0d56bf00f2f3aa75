"""What a role process (worker, maintenance) waits on: the shutdown flag's bounded sleep, and the stop signals."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from adx.agents import ShutdownSignal
from adx.agents._signals import STOP_SIGNALS, stop_on_signals


async def test_sleep_lasts_its_time_unless_the_flag_is_set() -> None:
    flag = ShutdownSignal()
    started = time.monotonic()
    assert await flag.sleep(0.05) is False
    assert time.monotonic() - started >= 0.05
    asyncio.get_running_loop().call_later(0.05, flag.set)
    started = time.monotonic()
    assert await flag.sleep(30.0) is True  # woken by set(), not by the 30 s
    assert time.monotonic() - started < 5.0
    assert await flag.sleep(30.0) is True  # once set, it stays set: no wait at all


async def test_a_stop_signal_calls_stop_while_inside_and_the_handlers_go_on_leaving() -> None:
    stopped: list[int] = []
    loop = asyncio.get_running_loop()
    with stop_on_signals(lambda: stopped.append(1)):
        for sig in STOP_SIGNALS:
            os.kill(os.getpid(), sig)
            for _ in range(100):
                if len(stopped) == STOP_SIGNALS.index(sig) + 1:
                    break
                await asyncio.sleep(0.01)
        assert stopped == [1, 1]
    assert all(not loop.remove_signal_handler(sig) for sig in STOP_SIGNALS)  # nothing left to remove
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
