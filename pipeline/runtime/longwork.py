"""Cancellation and heartbeats inside a member: the cancel gate of its chain, and its ticks.

:class:`LongWork` sits between the guard and the handler stage (``runtime/chain.py``), so every
message that would run passes it: a message fresh from its partition, a retry-tier copy that
came due, and a parked follower released from Redis alike. A message a standing cancellation
covers (:mod:`pipeline.cancel`), or whose ``pl-abandon-after-ms`` passed, is not run: its
outcome is ``cancelled``, counted and logged, and the guard treats it as finished, so the
followers of its key come up next (and are cancelled too, if covered).

Every other message runs, in its key lane's task, with a
:class:`~pipeline.runtime.liveness.Liveness`: the handler's ``ctx.heartbeat()`` and
``ctx.cancelled`` reach it. Every ``runtime.cancel_poll_ms`` the member ticks: it beats for its
``async`` runs (its event loop is alive; a ``cpu=True`` run beats from its worker, four times a
heartbeat timeout, and from the pool while it waits for one: :mod:`pipeline.runtime.cpu`) until
a handler beats on its own (``ctx.heartbeat()``), sends the heartbeats of its long work (lanes with
``heartbeat_timeout``) to Redis with the runs begun and ended since the last tick, rereads the
standing cancellations when their version moved, stops the runs they cover or that Redis says must
stop, runs the reconciler (:mod:`pipeline.cancel.reconcile`) and publishes its scale-in protection
(:mod:`pipeline.runtime.protection`). A stopped run's task is cancelled and the cancellation taken
back once the run ended (a ``cpu=True`` run's worker gets SIGTERM, then SIGKILL); a hung one is
routed like a failure (retry tier or dead-letter topic), any other ends ``cancelled``. A stop is
never the handler's failure: a handler that raises on its way out (a ``finally`` that fails) is
not routed by the handler stage (:func:`handler_raised`), its run ends as stopped, and the stop's
line names that error. Nor is a failure the stop's: once its handler has raised on its own, a
run is finishing (its failure routed to a retry tier or the dead-letter topic) and can no longer
be stopped; a cancellation or hung verdict that comes then is one line (already finishing) and
the routing goes on. A handler's own failure, running or not as long work, is told by the
failure log (:mod:`pipeline.runtime.failure_log`).

Without Redis nothing is cancelled and no heartbeats are kept; Redis errors are logged and the
member carries on (fail open).

Whose clock: a heartbeat leaves the member as how long ago it was (monotonic), and Redis records
it by its own clock, which the reconciler of any member judges it by, so hosts whose clocks
disagree judge each other's runs alike. ``pl-abandon-after-ms`` is a time a client wrote with its
own clock: the member judges it by the clock it is given (``clock_ms``: the member's shared
clock, Redis's time, :mod:`pipeline.runtime.shared_clock`), so members agree with each other and
the reconciler's re-check in Redis; the client's own clock still matters.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from redis import exceptions as rexc

from pipeline import headers as h
from pipeline.cancel.functions import CancelFunctions, SyncBatch
from pipeline.cancel.reconcile import Reconciler
from pipeline.cancel.target import ABANDONED, HUNG, Facts, Selectors, facts_of
from pipeline.envelope import Message
from pipeline.errors import PipelineError
from pipeline.log_repeats import error_text
from pipeline.observability.facades import RuntimeMetrics
from pipeline.retry.guard_store import message_id
from pipeline.runtime.app import Lane
from pipeline.runtime.cpu import RUN_BEAT_EVERY_S, beat_every_s
from pipeline.runtime.liveness import CURRENT, HandlerHung, Liveness
from pipeline.runtime.protection import ScaleInProtection
from pipeline.runtime.redirect import Redirector
from pipeline.runtime.shared_clock import local_ms
from pipeline.runtime.stats import Stats

log = logging.getLogger(__name__)

Call = Callable[[Lane, Message], Coroutine[Any, Any, str | None]]
"""The next stage: the handler stage."""


class RunStopped(asyncio.CancelledError):
    """A stopped run's handler raised on its way out: the stop goes on, its error as the cause."""


def handler_raised(error: Exception) -> None:
    """The current run's handler raised ``error``: the stop's, or its own failure.

    For the handler stage, before it routes a handler's failure. If the run was stopped
    (cancelled, hung), the stop's cancellation reached the handler, which raised something else
    on its way out: that is not the handler's failure (no retry-tier copy of cancelled work, no
    hung run told as an ordinary failure). :class:`RunStopped` is raised from ``error``, and the
    gate takes the stop back and ends the run as stopped (:meth:`LongWork._stopped`).

    Else it is the handler's own failure, and from now on the run is finishing: it can no longer
    be stopped (:meth:`LongWork.stop`), so a stop cannot cancel the failure's routing half-way
    (its line lost, a hung run's copy made twice).
    """
    run = _RUNNING.get()
    if run is None:
        return
    if run.liveness.reason is not None:
        raise RunStopped from error
    run.finishing = True


@dataclass(slots=True, eq=False)
class _Run:
    """One message running in this member."""

    ident: str | int
    """``lane/member/n`` for long work (its name in Redis), else just ``n``."""
    lane: Lane
    message: Message
    facts: Facts | None
    """What a cancellation can match (read from the headers when first needed)."""
    liveness: Liveness
    task: asyncio.Task[Any]
    """The task the run is in (a key lane's worker): a stop cancels it."""
    long: bool
    synced_beat_s: float = -1.0
    """The monotonic time of the last heartbeat that reached Redis (-1: none yet)."""
    finishing: bool = False
    """Its handler raised on its own (:func:`handler_raised`): it can no longer be stopped."""
    refused: bool = False
    """A stop came while it was finishing (said once)."""


_RUNNING: ContextVar[_Run | None] = ContextVar("pipeline_longwork_run", default=None)
"""The run the current task is in, as :data:`~pipeline.runtime.liveness.CURRENT` (set with it)."""

if sys.version_info < (3, 12):
    # Python 3.11's asyncio.current_task is Python code around this dict of the C accelerator
    # (asyncio.tasks imports it from _asyncio): the two C calls alone take half the time, and
    # every message asks once.
    _TASKS: dict[asyncio.AbstractEventLoop, asyncio.Task[Any]] = vars(asyncio.tasks)[
        "_current_tasks"
    ]

    def _current_task() -> asyncio.Task[Any] | None:
        return _TASKS.get(asyncio.get_running_loop())

else:
    _current_task = asyncio.current_task


class LongWork:
    """The cancel gate and heartbeat ticks of one member (see the module docstring)."""

    def __init__(
        self,
        call: Call,
        routing: Redirector,
        stats: Stats,
        lanes: Sequence[Lane],
        *,
        functions: CancelFunctions | None,
        poll_s: float,
        protection: ScaleInProtection | None = None,
        metrics: RuntimeMetrics | None = None,
        clock_ms: Callable[[], int] = local_ms,
    ) -> None:
        """Gate the runs of ``call``; ``functions`` (Redis) holds cancellations and beats.

        ``clock_ms`` is the now that ``pl-abandon-after-ms`` and the cancellations' keep times
        are judged by: the member's shared clock (Redis's), the host's by default.
        """
        self._clock_ms = clock_ms
        self._call = call
        self._routing = routing
        self._stats = stats
        self._functions = functions
        self._poll_s = poll_s
        self._protection = protection
        self._metrics = metrics
        self.member = uuid.uuid4().hex[:12]
        self._numbers = itertools.count(1)
        self._runs: dict[str | int, _Run] = {}
        self._batch = SyncBatch()
        self.selectors = Selectors()
        """The standing cancellations as last read."""
        timeouts = {
            lane.name: lane.spec.heartbeat_timeout_ms
            for lane in lanes
            if lane.spec.heartbeat_timeout_ms is not None
        }
        self._reconciler = (
            Reconciler(functions, timeouts) if functions is not None and timeouts else None
        )
        self._synced = False
        """The last tick reached Redis (False at start and after a failed tick)."""
        self._sweep_from_s = 0.0
        """When (monotonic) this member may judge runs again after a tick that failed."""

    @property
    def running(self) -> int:
        """Runs in this member now."""
        return len(self._runs)

    def long_messages(self) -> list[Message]:
        """The messages of the long work (lanes with ``heartbeat_timeout``) running here now."""
        return [run.message for run in self._runs.values() if run.long]

    # -- the gate -----------------------------------------------------------------------------

    async def __call__(self, lane: Lane, message: Message) -> str | None:
        """Skip ``message`` if its work is cancelled, else run it as a stoppable task."""
        long = lane.spec.heartbeat_timeout_ms is not None
        facts: Facts | None = None
        if long or self.selectors or h.ABANDON_AFTER_MS in message.headers:
            facts = facts_of(message, message_id(message))
            reason = self.selectors.reason(lane.name, facts, self._clock_ms())
            if reason is not None:
                self._cancelled(lane, message, reason, "skipped")
                return "cancelled"
        task = _current_task()
        assert task is not None  # noqa: S101 - the chain runs in tasks
        liveness = Liveness(timed=long)
        number = next(self._numbers)
        run = _Run(
            f"{lane.name}/{self.member}/{number}" if long else number,
            lane,
            message,
            facts,
            liveness,
            task,
            long,
        )
        self._runs[run.ident] = run
        if long:
            self._batch.begun[str(run.ident)] = _record(run, self.member)
        # The handler runs in this task (no task of its own: none to create per message); a
        # stop cancels this task and the cancellation is taken back here (uncancel).
        token = CURRENT.set(liveness)
        running = _RUNNING.set(run)
        timeout_ms = lane.spec.heartbeat_timeout_ms
        beats = None
        if timeout_ms is not None and lane.cpu_ref is not None:  # its worker beats this often
            beats = RUN_BEAT_EVERY_S.set(beat_every_s(timeout_ms))
        taken_back = False
        try:
            return await self._call(lane, message)
        except asyncio.CancelledError as exc:
            if liveness.reason is None or task.cancelling() > 1:
                raise  # not (only) ours: the member itself is being stopped
            task.uncancel()
            taken_back = True
            raised = exc.__cause__ if isinstance(exc, RunStopped) else None
            return await self._stopped(run, liveness.reason, raised)
        finally:
            CURRENT.reset(token)
            _RUNNING.reset(running)
            if beats is not None:
                RUN_BEAT_EVERY_S.reset(beats)
            del self._runs[run.ident]
            if liveness.reason is not None and not taken_back and task.cancelling() > 0:
                task.uncancel()  # the handler swallowed its cancellation: take ours back
            if long and self._batch.begun.pop(str(run.ident), None) is None:
                self._batch.ended.append(str(run.ident))

    def skips(self, lane: Lane, message: Message) -> bool:
        """Whether ``message`` of ``lane`` is cancelled work: if so it is counted and logged.

        For work that does not pass the gate one message at a time: a debounced turn's
        buffered messages, checked when their turn comes up.
        """
        if not self.selectors and h.ABANDON_AFTER_MS not in message.headers:
            return False
        facts = facts_of(message, message_id(message))
        reason = self.selectors.reason(lane.name, facts, self._clock_ms())
        if reason is None:
            return False
        self._cancelled(lane, message, reason, "skipped")
        return True

    async def _stopped(
        self, run: _Run, reason: str, raised: BaseException | None = None
    ) -> str | None:
        """The outcome of a run stopped for ``reason``: hung ones are routed like failures.

        ``raised``: what its handler raised on its way out of the stop, named on the line.
        """
        lane, message = run.lane, run.message
        after = _raised(raised)
        if reason != HUNG:
            self._cancelled(lane, message, reason, "stopped", after)
            return "cancelled"
        self._stats.hung += 1
        self._count(f"{lane.name}:hung")
        if self._metrics is not None:
            self._metrics.hung(lane.name)
        timeout_ms = lane.spec.heartbeat_timeout_ms or 0
        log.warning(
            "hung %s on lane %s: silent past its heartbeat timeout (%d ms); stopped%s",
            _where(message),
            lane.name,
            timeout_ms,
            after,
        )
        error = HandlerHung(f"silent for more than {timeout_ms} ms (heartbeat_timeout)")
        attempt = h.attempt(message.topic, message.headers)
        return await self._routing.failure(lane, message, attempt, error)

    def _cancelled(
        self, lane: Lane, message: Message, reason: str, how: str, after: str = ""
    ) -> None:
        """Count and log a message of cancelled work (``how``: skipped or stopped).

        ``after``: what its handler raised on its way out of the stop (:func:`_raised`).
        """
        self._stats.cancelled += 1
        self._count(f"{lane.name}:cancelled")
        if self._metrics is not None:
            self._metrics.cancelled(lane.name, ABANDONED if reason == ABANDONED else "requested")
        log.info(
            "cancelled %s on lane %s (%s): %s%s", _where(message), lane.name, how, reason, after
        )

    def _count(self, name: str) -> None:
        if self._functions is not None:
            self._batch.counts[name] = self._batch.counts.get(name, 0) + 1

    def stop(self, ident: str | int, reason: str) -> bool:
        """Stop run ``ident`` for ``reason`` (once); False if it is not running here.

        Nor if it is finishing (its handler raised on its own, :func:`handler_raised`): its
        failure's routing goes on, and the stop is said once, at INFO.
        """
        run = self._runs.get(ident)
        if run is None or run.liveness.reason is not None:
            return False
        if run.finishing:
            if not run.refused:
                run.refused = True
                log.info(
                    "not stopping %s on lane %s (%s): already finishing, its handler ended on"
                    " its own",
                    _where(run.message),
                    run.lane.name,
                    reason,
                )
            return False
        run.liveness.reason = reason
        run.task.cancel()
        return True

    # -- the ticks ----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Tick every ``poll_s`` until ``stop`` is set."""
        while not stop.is_set():
            await self.tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._poll_s)

    async def tick(self) -> None:
        """Beat, sync with Redis, stop what must stop, publish the protection."""
        for run in self._runs.values():
            if run.lane.cpu_ref is None and not run.liveness.manual:
                run.liveness.beat()  # the loop is alive; cpu=True runs beat from their worker
        if self._functions is not None:
            try:
                await self._sync(self._functions)
            except (rexc.RedisError, OSError, PipelineError) as exc:
                self._synced = False
                log.warning("could not sync cancellations and heartbeats with Redis: %s", exc)
        now = self._clock_ms()
        if self.selectors or any(run.facts and run.facts.abandon_ms for run in self._runs.values()):
            for run in list(self._runs.values()):  # standing cancellations cover running work too
                reason = self.selectors.reason(run.lane.name, _facts(run), now)
                if reason is not None:
                    self.stop(run.ident, reason)
        if self._protection is not None:
            await self._protection.update(
                run.liveness.started_s for run in self._runs.values() if run.long
            )

    async def _sync(self, functions: CancelFunctions) -> None:
        batch, self._batch = self._batch, SyncBatch()
        long = [run for run in self._runs.values() if run.long]
        # Each heartbeat goes as its age, by the monotonic clock: Redis records it by its own
        # clock (its time less the age), which every member's reconciler judges it by. The age
        # is read before the call: a run looks fresher by the call's way there, never staler.
        sent = {run: run.liveness.beat_s for run in long if run.liveness.beat_s > run.synced_beat_s}
        now_s = time.monotonic()
        for run, beat_s in sent.items():
            batch.ages[str(run.ident)] = int((now_s - beat_s) * 1000)
        try:
            version, stopping = await functions.sync(0, batch, [str(run.ident) for run in long])
        except BaseException:
            self._batch = _merged(batch, self._batch)
            raise
        for run, beat_s in sent.items():
            run.synced_beat_s = max(run.synced_beat_s, beat_s)
        if version != self.selectors.version:
            self.selectors = Selectors(*await functions.selectors())
        for ident, reason in stopping.items():
            self.stop(ident, reason)
        if not self._synced:
            # Back from an outage (or just started): the other members send the beats they kept
            # meanwhile on their next tick. Until then their runs only look silent.
            self._synced = True
            self._sweep_from_s = time.monotonic() + 2 * self._poll_s
        if self._reconciler is not None and time.monotonic() >= self._sweep_from_s:
            await self._reconciler.sweep(self.selectors)

    async def close(self) -> None:
        """Send the last ends and clear the scale-in protection."""
        if self._functions is not None:
            with contextlib.suppress(rexc.RedisError, OSError, PipelineError):
                await self._sync(self._functions)
        if self._protection is not None:
            await self._protection.close()


def _where(message: Message) -> str:
    """Where ``message`` was read, as the failure log says it: ``topic[partition]@offset``."""
    return f"{message.topic}[{message.partition}]@{message.offset}"


def _raised(error: BaseException | None) -> str:
    """The end of a stop's line naming what its handler raised on the way out; empty if none."""
    if error is None:
        return ""
    text = " ".join(error_text(error)[:_RAISED_CHARS].split())
    return f"; its handler raised {type(error).__name__}: {text} as it stopped"


_RAISED_CHARS = 300
"""Characters of that error's text on the stop's line."""


def _facts(run: _Run) -> Facts:
    """The run's facts, read from its message's headers the first time they are needed."""
    if run.facts is None:
        run.facts = facts_of(run.message, message_id(run.message))
    return run.facts


def _record(run: _Run, member: str) -> str:
    """The JSON a long run is registered with in Redis (absent facts left out)."""
    facts = _facts(run)
    fields = {
        "lane": run.lane.name,
        "member": member,
        "event": facts.event,
        "key": facts.key,
        "tenant": facts.tenant,
        "origin": facts.origin_ms,
        "abandon": facts.abandon_ms,
    }
    return json.dumps({k: v for k, v in fields.items() if v is not None}, separators=(",", ":"))


def _merged(first: SyncBatch, then: SyncBatch) -> SyncBatch:
    """A batch that failed to send, with what was added since, to send on the next tick.

    Its heartbeats' ages are left out: they grow stale, and the next tick sends each run's
    latest heartbeat again, with its age then (the runs' synced times did not move).
    """
    merged = SyncBatch({**first.begun, **then.begun}, first.ended + then.ended)
    merged.beats = {**first.beats, **then.beats}
    for name, count in [*first.counts.items(), *then.counts.items()]:
        merged.counts[name] = merged.counts.get(name, 0) + count
    return merged
