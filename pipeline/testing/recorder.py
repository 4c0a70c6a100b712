"""What ran: every handler call of a lane, with its events, context, outcome and virtual times."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.cancel.target import HUNG
from pipeline.envelope import Message
from pipeline.errors import Skip
from pipeline.runtime import liveness
from pipeline.runtime.app import Handler
from pipeline.runtime.context import Context


@dataclass(slots=True)
class Run:
    """One handler call.

    Attributes:
        lane: the lane.
        event: what the handler received: an event, or the list of events of a debounced turn.
        context: the handler's ``ctx`` (message, attempt, tenant, key, ...).
        started_s: virtual epoch seconds when the call started.
        ended_s: when it returned or raised (None while it runs).
        error: what it raised (None when it returned).
        stopped_for: why the runtime stopped the call (``pipeline cancel``, ``app.cancel``, an
            abandoned or hung run), None when it was not stopped.
    """

    lane: str
    event: Any
    context: Context
    started_s: float
    ended_s: float | None = None
    error: BaseException | None = None
    stopped_for: str | None = None

    @property
    def attempt(self) -> int:
        """1 for the first attempt, 2 for the first retry, ..."""
        return self.context.attempt

    @property
    def message(self) -> Message:
        """The message (of a turn: its last one)."""
        return self.context.message

    @property
    def tenant(self) -> str | None:
        """The tenant header of the message."""
        return self.context.tenant

    @property
    def outcome(self) -> str:
        """``running``, ``handled``, ``skipped``, ``cancelled`` or ``failed``.

        A call the runtime stopped as cancelled work is ``cancelled`` (not retried); one stopped
        as hung is ``failed``, as the runtime routes it like a failure.
        """
        if self.ended_s is None:
            return "running"
        if self.error is None:
            return "handled"
        if isinstance(self.error, Skip):
            return "skipped"
        if self.stopped_for is not None and self.stopped_for != HUNG:
            return "cancelled"
        return "failed"


def _leave_out_of_traceback(exc: BaseException, wrapper: Callable[..., Any]) -> None:
    """Drop ``wrapper``'s own frame from the traceback ``exc`` carries on (re-raised bare).

    The retry router's ``pl-error-digest`` hashes every frame an error was raised through: with
    the recording wrapper's frame in it, each failure got another digest than in production.
    """
    tb = exc.__traceback__
    if tb is not None and tb.tb_frame.f_code is wrapper.__code__:
        exc.__traceback__ = tb.tb_next


@dataclass
class Recorder:
    """Collects the :class:`Run` of every wrapped handler, in the order they started."""

    runs: list[Run] = field(default_factory=list)
    steps: list[tuple[Run, int]] = field(default_factory=list)
    """Every start (+1) and end (-1) of a run, in the order they happened."""

    def wrap(self, lane: str, handler: Handler) -> Handler:
        """``handler`` recording each call; same signature, so the App decodes as before."""

        @functools.wraps(handler)
        async def recorded(event: Any, ctx: Context) -> None:
            run = Run(lane, event, ctx, time.time())
            self.runs.append(run)
            self.steps.append((run, 1))
            try:
                await handler(event, ctx)
            except BaseException as exc:
                run.error = exc
                run_liveness = liveness.CURRENT.get()
                if isinstance(exc, asyncio.CancelledError) and run_liveness is not None:
                    run.stopped_for = run_liveness.reason
                _leave_out_of_traceback(exc, recorded)
                raise
            finally:
                run.ended_s = time.time()
                self.steps.append((run, -1))

        return recorded

    def of(self, lane: str, where: Callable[[Run], bool] | None = None) -> list[Run]:
        """The runs of ``lane`` (those ``where`` accepts)."""
        return [r for r in self.runs if r.lane == lane and (where is None or where(r))]

    def running(self) -> int:
        """Calls that have not ended yet."""
        return sum(1 for r in self.runs if r.ended_s is None)

    def peak_concurrency(self, lane: str, where: Callable[[Run], bool] | None = None) -> int:
        """The most calls of ``lane`` (those ``where`` accepts) that ran at the same time.

        Counted in the order starts and ends happened, not by their virtual times: a call that
        took no virtual time still ran, and one that ended before another started, in the same
        virtual instant, did not overlap it.
        """
        chosen = {id(run) for run in self.of(lane, where)}
        peak = current = 0
        for run, step in self.steps:
            if id(run) in chosen:
                current += step
                peak = max(peak, current)
        return peak
