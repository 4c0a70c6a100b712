"""VirtualClock: time.time and time.monotonic are virtual and idle waits jump to the next timer."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipeline.errors import ConfigError
from pipeline.testing import VirtualClock


async def test_a_ten_minute_sleep_passes_ten_virtual_minutes() -> None:
    """Both clock functions move by the slept time, and timers still fire in their order."""
    clock = VirtualClock(start_s=1_000_000.0)
    clock.start()
    try:
        assert time.time() == 1_000_000.0
        started = time.monotonic()
        order: list[str] = []

        async def after(delay_s: float, name: str) -> None:
            await asyncio.sleep(delay_s)
            order.append(name)

        await asyncio.gather(after(600, "ten minutes"), after(5, "five seconds"))
        assert order == ["five seconds", "ten minutes"]
        assert 600 <= time.monotonic() - started < 601
        assert 600 <= time.time() - 1_000_000.0 < 601
    finally:
        clock.stop()


async def test_stop_gives_the_real_clock_back() -> None:
    """After stop, time.time is the real one again and the loop waits for real."""
    clock = VirtualClock(start_s=0.0)
    clock.start()
    assert time.time() < 10
    clock.stop()
    assert time.time() > 1_700_000_000


async def test_wait_for_with_a_remainder_does_not_spin() -> None:
    """A loop re-waiting for the rest of a deadline ends: every loop turn takes a microsecond."""
    clock = VirtualClock()
    clock.start()
    try:
        deadline = time.monotonic() + 0.5
        never = asyncio.Event()
        turns = 0
        while (remaining := deadline - time.monotonic()) > 0:
            turns += 1
            try:
                await asyncio.wait_for(never.wait(), remaining / 10)
            except TimeoutError:
                continue
        assert turns >= 10
    finally:
        clock.stop()


def test_on_uvloop_the_error_names_only_a_remedy_that_exists() -> None:
    """Under uvloop the clock refuses to start, naming asyncio's loop as the remedy, no other."""
    uvloop = pytest.importorskip("uvloop")

    async def start() -> None:
        VirtualClock().start()

    with pytest.raises(ConfigError) as info:
        uvloop.run(start())
    message = str(info.value)
    assert "needs asyncio's selector event loop, not Loop" in message
    assert "clock=False" not in message  # TestApp has no such option: it always runs one
