"""A running handler's line to the runtime: its heartbeats out, its cancellation in.

The runtime gives each run a :class:`Liveness` in a context variable before the handler starts, so
:meth:`Context.heartbeat` and :attr:`Context.cancelled` reach it without the handler passing
anything around. Until the handler first calls ``ctx.heartbeat()`` the runtime beats for it while
its event loop or worker process is alive; from that call on only the handler's own beats count, so
a handler that stops making progress falls silent. In a ``cpu=True`` worker process there is no such
variable: there :func:`heartbeat` sends a beat over the worker's pipe (:mod:`pipeline.runtime.cpu`),
where the member turns it into a heartbeat of the run waiting for that worker.

A heartbeat is kept on the monotonic clock only: the member sends Redis how long ago it was
(:mod:`pipeline.runtime.longwork`), and Redis records it by its own clock, so another member,
whose host's clock may disagree, judges it by the same clock.
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

    __slots__ = ("beat_s", "manual", "reason", "started_s")

    def __init__(self, *, timed: bool = True) -> None:
        """A run that beat just now and was not told to stop.

        ``timed=False`` (work that keeps no heartbeats) leaves the clock unread until a beat.
        """
        self.started_s = time.monotonic() if timed else 0.0
        self.beat_s = self.started_s
        """When it last beat, by the monotonic clock (no host's wall clock: see above)."""
        self.reason: str | None = None
        self.manual = False
        """The handler called ``ctx.heartbeat()``: from then on only its own beats count."""

    def beat(self, *, manual: bool = False) -> None:
        """Record a heartbeat now (``manual``: the handler's own, see :attr:`manual`)."""
        self.beat_s = time.monotonic()
        self.manual = self.manual or manual


CURRENT: ContextVar[Liveness | None] = ContextVar("pipeline_liveness", default=None)
"""The run the current task belongs to (set by :mod:`pipeline.runtime.longwork`)."""

worker_beat: Callable[[], None] | None = None
"""In a ``cpu=True`` worker process: sends one heartbeat to the member (set by the worker)."""


worker_cancelled: Callable[[], bool] | None = None
"""In a ``cpu=True`` worker process: whether the worker was told to stop (SIGTERM)."""


def heartbeat() -> None:
    """The handler's own heartbeat (``ctx.heartbeat()``; nothing outside a run)."""
    current = CURRENT.get()
    if current is not None:
        current.beat(manual=True)
    elif worker_beat is not None:
        worker_beat()


def automatic() -> None:
    """A heartbeat of the runtime for the current run, unless the handler beats on its own."""
    current = CURRENT.get()
    if current is not None and not current.manual:
        current.beat()


def cancelled() -> bool:
    """Whether the run this code belongs to was told to stop."""
    current = CURRENT.get()
    if current is not None:
        return current.reason is not None
    return worker_cancelled is not None and worker_cancelled()
