"""A running handler's line to the runtime: its heartbeats out, its cancellation in.

The runtime gives each run a :class:`Liveness` in a context variable before the handler
starts, so :meth:`Context.heartbeat` and :attr:`Context.cancelled` reach it without the handler
passing anything around. In a ``cpu=True`` worker process there is no such variable: there
:func:`heartbeat` sends a beat over the worker's pipe (:mod:`pipeline.runtime.cpu`), where the
member turns it into a heartbeat of the run waiting for that worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar

from pipeline.errors import PipelineError


class HandlerHung(PipelineError):
    """A handler fell silent past its lane's heartbeat timeout and was stopped (retryable)."""


class Liveness:
    """One run's last heartbeat and, once told to stop, why."""

    __slots__ = ("beat_ms", "beat_s", "reason", "started_s")

    def __init__(self) -> None:
        """A run that beat just now and was not told to stop."""
        self.started_s = time.monotonic()
        self.beat_s = self.started_s
        self.beat_ms = int(time.time() * 1000)
        self.reason: str | None = None

    def beat(self) -> None:
        """Record a heartbeat now."""
        self.beat_s = time.monotonic()
        self.beat_ms = int(time.time() * 1000)


CURRENT: ContextVar[Liveness | None] = ContextVar("pipeline_liveness", default=None)
"""The run the current task belongs to (set by :mod:`pipeline.runtime.longwork`)."""

worker_beat: Callable[[], None] | None = None
"""In a ``cpu=True`` worker process: sends one heartbeat to the member (set by the worker)."""


def heartbeat() -> None:
    """Record progress of the run this code belongs to (nothing outside a run)."""
    current = CURRENT.get()
    if current is not None:
        current.beat()
    elif worker_beat is not None:
        worker_beat()


def cancelled() -> bool:
    """Whether the run this code belongs to was told to stop."""
    current = CURRENT.get()
    return current is not None and current.reason is not None
