"""Hosts whose clocks are off, in one test process (``from skewed_hosts import ...``).

``time.time`` is patched (:func:`skewed_clocks`) to add the skew of the code that reads it,
held in a context variable: the block run under :func:`on_host` and every task it starts see
their host's clock, the rest the real one. The monotonic clock is left alone, as on a real host
whose wall clock is wrong or is stepped by NTP.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

_SKEW_S: contextvars.ContextVar[float] = contextvars.ContextVar("skew_s", default=0.0)


@contextmanager
def skewed_clocks() -> Iterator[None]:
    """Within the block, ``time.time`` runs as far off as the reading code's host (none: 0)."""
    real = time.time
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: real() + _SKEW_S.get())
        yield


@contextmanager
def on_host(skew_s: float) -> Iterator[None]:
    """Run the block, and the tasks it starts, on a host whose clock is ``skew_s`` seconds off."""
    token = _SKEW_S.set(skew_s)
    try:
        yield
    finally:
        _SKEW_S.reset(token)
