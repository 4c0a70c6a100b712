"""A virtual clock for tests: retry tiers, debounce windows and leases pass without waiting.

While a :class:`VirtualClock` is running, :func:`time.time` and :func:`time.monotonic` read
virtual time, and the running asyncio loop never sleeps: when every task waits and the loop
would block until its next timer, the clock jumps to that timer instead. Code that waits with
``asyncio.sleep``, ``loop.call_later``, ``asyncio.wait_for`` or compares ``time.time()`` with a
due time (the runtime's due gate, the retry router, deadlines, Redis ``TIME`` in fakeredis) sees
a 10-minute retry tier pass in microseconds, in the same order as it would in real time.

Limits: time spent computing does not move the clock (each turn of the loop counts as one
microsecond, :data:`TICK_S`, whatever it really took), and work
done in other threads or processes is not waited for by a jump. Modules that took their own
reference to a clock function at import (``from time import time``) keep real time.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable
from typing import Any

from pipeline.errors import ConfigError

TICK_S = 1e-6
"""Virtual time one turn of the event loop takes."""
_REAL_TIME = time.time
_REAL_MONOTONIC = time.monotonic


class VirtualClock:
    """Virtual ``time.time``/``time.monotonic`` and a loop that jumps over idle waits."""

    def __init__(self, start_s: float | None = None) -> None:
        """Start at epoch second ``start_s`` (default: the real time now)."""
        self._epoch_s = _REAL_TIME() if start_s is None else start_s
        self._monotonic_s = _REAL_MONOTONIC()
        self.advanced_s = 0.0
        """Virtual seconds passed since the clock was made."""
        self._undo: list[Callable[[], None]] = []

    def time(self) -> float:
        """Virtual seconds since the epoch."""
        return self._epoch_s + self.advanced_s

    def monotonic(self) -> float:
        """Virtual monotonic seconds."""
        return self._monotonic_s + self.advanced_s

    def advance(self, seconds: float) -> None:
        """Move the clock forward (timers that fall due run at the loop's next iteration)."""
        if seconds > 0:
            self.advanced_s += seconds

    def start(self) -> None:
        """Take over the clock functions and the running loop's idle waits."""
        if self._undo:
            return
        loop = asyncio.get_running_loop()
        selector = getattr(loop, "_selector", None)
        if not isinstance(selector, selectors.BaseSelector):
            raise ConfigError(
                f"the virtual clock needs asyncio's selector event loop, not {type(loop).__name__}"
                " (run the test on asyncio's own loop: no uvloop event loop policy or loop factory)"
            )
        real_select = selector.select

        def select(timeout: float | None = None) -> list[tuple[Any, int]]:
            # Every turn of the loop takes a microsecond, as real turns take some time: a
            # loop such as `while monotonic() < deadline: await wait_for(x, deadline -
            # monotonic())` would otherwise spin on a remainder of a few ulps forever.
            self.advance(TICK_S)
            events = real_select(0)
            if events or timeout is None or timeout <= 0:
                return events if events or timeout is not None else real_select(None)
            self.advance(timeout)  # nothing to do until the next timer: jump to it
            return []

        selector.select = select  # type: ignore[method-assign]
        time.time = self.time
        time.monotonic = self.monotonic
        self._undo = [
            lambda: setattr(selector, "select", real_select),
            lambda: setattr(time, "time", _REAL_TIME),
            lambda: setattr(time, "monotonic", _REAL_MONOTONIC),
        ]

    def stop(self) -> None:
        """Give the clock functions and the loop back."""
        for undo in self._undo:
            undo()
        self._undo = []

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass, with everything that falls due in them."""
        await asyncio.sleep(seconds)
