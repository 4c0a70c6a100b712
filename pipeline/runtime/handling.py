"""The handler stage, last in a member's chain: decode, call the handler, route what failed.

:class:`HandlerStage` is called by the guard (``runtime/guard.py``) for each message that may
run. A message deferred by the admission gate, past its deadline or shed by a standing queue
does not reach its handler (:mod:`~pipeline.runtime.sojourn`). Otherwise the handler runs in the
event loop, in the CPU pool for ``cpu=True`` lanes, or, on debounced lanes, the message is
recorded for its conversation's turn (:mod:`~pipeline.runtime.turns`). Every failure is routed
by :class:`~pipeline.runtime.redirect.Redirector` (retry tier or dead-letter topic); the outcome
string says what happened, and :class:`~pipeline.runtime.failure_log.FailureLog` logs it (with
its traceback, repeats backed off), a debounced turn's failure too.

Deadlines and waiting times compare now with times other hosts wrote (a ticker's
``pl-deadline-ms``, a retry copy's due time): now is read off the stage's clock, which in a
member with Redis is Redis's (:class:`~pipeline.runtime.shared_clock.SharedClock`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from pipeline import headers as h
from pipeline import tracing
from pipeline.admission.adaptive import Feedback, feedback_for
from pipeline.envelope import Message, TopicPartition
from pipeline.errors import DebounceUnavailable, Expired, PipelineError, Skip, Throttled
from pipeline.log_repeats import error_text
from pipeline.observability.facades import DebounceMetrics, RuntimeMetrics
from pipeline.offload.reference import OFFLOAD
from pipeline.runtime.app import App, Lane
from pipeline.runtime.context import Context
from pipeline.runtime.cpu import ProcessPool
from pipeline.runtime.due import due_ms
from pipeline.runtime.failure_log import FailureLog
from pipeline.runtime.idempotency import IdempotencyGuard
from pipeline.runtime.longwork import handler_raised
from pipeline.runtime.payloads import Payloads
from pipeline.runtime.redirect import Redirector, Routed
from pipeline.runtime.shared_clock import local_ms
from pipeline.runtime.sojourn import StandingQueue, deadline_ms, due_since_ms
from pipeline.runtime.stats import Stats
from pipeline.runtime.turns import DebouncedLanes, TurnOutcome

log = logging.getLogger(__name__)


class HandlerCancelled(PipelineError):
    """A handler raised ``CancelledError`` though no one stopped its run: its failure (retried).

    A future it awaited was cancelled by someone else, say. Let through, it would end the key
    lane's worker, the message neither routed nor told.
    """

    @classmethod
    def of(cls, error: asyncio.CancelledError) -> HandlerCancelled:
        """The failure for ``error``, with its traceback (the handler's frames) and as cause."""
        said = error_text(error)
        failure = cls(f"CancelledError{f' ({said})' if said else ''} raised by the handler itself")
        failure.__cause__ = error
        return failure.with_traceback(error.__traceback__)


def _asked_to_stop() -> bool:
    """Whether this task was cancelled (and that not taken back): a stop, not the handler's."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


class HandlerStage:
    """Runs handlers and routes their failures; one per member."""

    def __init__(
        self,
        app: App,
        routing: Redirector,
        stats: Stats,
        lanes: Sequence[Lane],
        *,
        cpu_workers: int,
        throttled: bool = False,
        idempotency: IdempotencyGuard | None = None,
        metrics: RuntimeMetrics | None = None,
        turn_metrics: DebounceMetrics | None = None,
        rows_finished: Callable[[Sequence[Message]], None] = lambda _: None,
        cancel_grace_s: float = 5.0,
        clock_ms: Callable[[], int] = local_ms,
    ) -> None:
        """Serve ``lanes`` of ``app``; ``rows_finished`` is told of settled debounced turns.

        ``throttled``: the member admits through a throttle, so adaptive lanes' calls are
        timed and reported when their slots are released. ``clock_ms``: now in ms since the
        epoch, against which deadlines and due times are judged.
        """
        self._app = app
        self._clock_ms = clock_ms
        self._routing = routing
        self._stats = stats
        self._cpu_workers = cpu_workers
        self._cancel_grace_s = cancel_grace_s
        self._throttled = throttled
        self._pool: ProcessPool | None = None
        self._idempotency = idempotency
        self._metrics = metrics
        self._turn_metrics = turn_metrics
        self._rows_finished = rows_finished
        self._standing = {
            lane.name: StandingQueue(lane.spec.sojourn) for lane in lanes if lane.spec.sojourn
        }
        self._payloads = Payloads(lanes, None if metrics is None else metrics.offload)
        self._failures = FailureLog()
        self.turns: DebouncedLanes | None = None
        """The debouncer, on a member with Redis and debounced lanes (set by the member)."""
        self.deferred: dict[int, Message] = {}
        """Messages the admission gate chose to defer through the first retry tier, by identity
        (``id``, each kept here so that no other object takes its id), until their run ends or
        their partition's revocation drops them unrun (the chain's ``drop``).

        Not by partition and offset: after a rejoin one offset can be in the member twice, a
        run that outlived the revocation and the copy read again. The copy deferred, the
        original's end would take its mark, and it would run holding no slot; an original
        still on its way to the handler would be taken for the deferred copy."""
        self._calls: dict[tuple[TopicPartition, int], tuple[float, Throttled | None]] = {}
        """Duration and Throttled error of handler calls on adaptive lanes, until released."""

    @property
    def deferring(self) -> set[tuple[TopicPartition, int]]:
        """Where the deferred messages were read (partition, offset), for tests."""
        return {(message.tp, message.offset) for message in self.deferred.values()}

    async def __call__(self, lane: Lane, message: Message) -> str | None:
        """Run ``message``'s handler (unless it must not run now); the outcome, None if unrouted."""
        deferred = bool(self.deferred) and id(message) in self.deferred
        reason = None if deferred else self._expired(lane, message)
        if deferred or reason is not None:  # not on the path of a message that runs now
            return await self._not_now(lane, message, reason)
        attempt = h.attempt(message.topic, message.headers)
        self._routing.processed(lane)
        if self._metrics is not None and h.DUE_MS in message.headers:  # (0 without it)
            due = due_ms(message)
            if due > 0:  # a retry-tier copy
                self._metrics.retry_started(lane.name, (self._clock_ms() - due) / 1000)
        called = time.perf_counter()
        try:
            buffered = await self._call(lane, message, attempt)
            if buffered is not None:
                return buffered
        except Skip:
            tracing.handler_ran(lane.name, called, None)
            self._stats.skipped += 1
            return "skipped"
        except asyncio.CancelledError as exc:
            if _asked_to_stop():
                raise  # a run's stop (the cancel gate's) or the member's, not a failure
            return await self._failed(lane, message, attempt, called, HandlerCancelled.of(exc))
        except Exception as exc:  # every handler failure is routed, none escapes
            return await self._failed(lane, message, attempt, called, exc)
        tracing.handler_ran(lane.name, called, None)
        if self._throttled and self._adaptive(lane):
            self._calls[(message.tp, message.offset)] = (time.perf_counter() - called, None)
        self._stats.handled += 1
        return "handled"

    async def _call(self, lane: Lane, message: Message, attempt: int) -> str | None:
        """Decode ``message`` and call its handler; a debounced lane's outcome, else None."""
        if OFFLOAD in message.headers:  # a reference: resolved off the loop, or lazily
            event = await self._payloads.event(lane, message)
        else:
            event = lane.decode(message)
        if lane.turns:
            return await self._buffer(lane, event, message, attempt)
        if lane.cpu_ref is None:
            await lane.handler(event, Context(message, lane.name, attempt, self._idempotency))
        else:
            context = Context(message, lane.name, attempt)  # no Redis in the worker
            await self._cpu_pool().run(lane.cpu_ref, (event, context), lane.time_limit_s)
        return None

    async def _failed(
        self, lane: Lane, message: Message, attempt: int, called: float, exc: Exception
    ) -> str | None:
        """Route and tell the failure ``exc`` of ``message``'s handler (called at ``called``)."""
        handler_raised(exc)  # a stopped run's is the stop's; else no stop from now on
        tracing.handler_ran(lane.name, called, exc)
        if isinstance(exc, Throttled) and self._adaptive(lane):  # other failures: no signal
            self._calls[(message.tp, message.offset)] = (time.perf_counter() - called, exc)
        with self._failures.telling(exc):  # its dead letter is said by the failure's line
            routed = await self._routing.routed(lane, message, attempt, exc)
            self._failures.failed(lane, message, attempt, exc, routed)
        return routed.outcome

    def _expired(self, lane: Lane, message: Message) -> str | None:
        """Why ``message`` must not run now (``expired`` or ``shed``), or None to run it."""
        deadline = deadline_ms(message, lane.spec)
        standing = self._standing.get(lane.name)
        if deadline is None and standing is None:
            return None  # nothing to judge: the clock is not read
        now_ms = self._clock_ms()
        if deadline is not None and now_ms > deadline:
            self._stats.expired += 1
            log.info(
                "expired %s@%d (deadline %d, %d ms ago)",
                message.tp,
                message.offset,
                deadline,
                now_ms - deadline,
            )
            return "expired"
        if standing is not None and not standing.admit(now_ms - due_since_ms(message), now_ms):
            self._stats.shed += 1
            log.info(
                "shed %s@%d: lane %s has a standing queue", message.tp, message.offset, lane.name
            )
            return "shed"
        return None

    async def _not_now(self, lane: Lane, message: Message, reason: str | None) -> str | None:
        """The outcome of a message that must not run now: deferred, or ``reason`` (expired, shed).

        ``reason`` None: it is deferred (it goes through the first retry tier, its key parked).
        """
        if reason is None:
            return await self._routing.divert(lane, message, "deferred")
        if self._metrics is not None:
            self._metrics.expired(lane.name)
        if lane.spec.on_expiry == "drop":
            return "expired"
        error = Expired(f"{reason}: it waited past what lane {lane.name} allows")
        return await self._routing.dead_letter(lane, message, reason, error)

    async def _buffer(self, lane: Lane, event: Any, message: Message, attempt: int) -> str:
        """Record a debounced lane's message for its conversation's turn (fail open)."""
        if self.turns is not None:
            try:
                await self.turns.record(lane, event, message)
            except DebounceUnavailable:
                pass  # logged and counted by the debouncer; the message is its own turn
            else:
                self._stats.buffered += 1
                return "buffered"
        await lane.handler([event], Context(message, lane.name, attempt, self._idempotency))
        self._stats.handled += 1
        self._stats.turns += 1
        return "handled"

    async def settle_turn(self, lane: Lane, turn: TurnOutcome) -> bool:
        """Count a finished turn, dead-letter it if it failed for good; False: run it again.

        ``cancelled``: messages left out of their turn as cancelled work (counted where they
        were found); they are finished. A turn whose handler ran is one delivery of its lane,
        timed, with the outcome the turn had (its messages were each counted as buffered).
        """
        if turn.outcome == "cancelled":
            self._rows_finished(turn.messages)
            return True
        outcome = await self._settle_turn(lane, turn)
        if self._metrics is not None and turn.duration_s is not None:
            self._metrics.delivered(lane.name, outcome or "unrouted", turn.duration_s)
        return outcome in ("handled", "skipped", "dead_lettered")

    async def _settle_turn(self, lane: Lane, turn: TurnOutcome) -> str | None:
        """The turn's outcome once counted and routed: ``retried`` runs it again; None unrouted."""
        if turn.outcome in ("handled", "skipped"):
            self._stats.turns += 1
            if self._turn_metrics is not None:
                self._turn_metrics.turn(lane.name, len(turn.messages), turn.lateness_s)
            if turn.outcome == "handled":
                self._stats.handled += len(turn.messages)
            else:
                self._stats.skipped += len(turn.messages)
            self._rows_finished(turn.messages)
            return turn.outcome
        # Its dead letters are said by the turn's line, when that says dead letter; produced
        # ones of a turn not routed in full (a later one failed) keep their own warnings.
        with self._failures.telling(turn.error):
            routed = await self._route_turn(lane, turn)
            if turn.error is not None:
                self._failures.turn_failed(lane, turn.messages, turn.attempts, turn.error, routed)
        return routed.outcome

    async def _route_turn(self, lane: Lane, turn: TurnOutcome) -> Routed:
        """Where a failed turn goes: run again (``retried``) or its messages dead-lettered."""
        error = turn.error
        fatal = error is not None and not self._routing.retryable(lane, error, "a turn")
        if turn.outcome == "failed" and not fatal:
            self._stats.turn_retries += 1
            return Routed("retried", "")
        reason = getattr(error, "dead_reason", "fatal") if fatal else "exhausted"
        first_ms = turn.first_failure_ms
        first_failure = None if first_ms is None else str(first_ms).encode()
        for message in turn.messages:  # in order: a sequenced dead letter
            if first_failure is not None:  # else this run's failure is the first
                message.headers[h.FIRST_FAILURE_MS] = first_failure
            routed = await self._routing.dead_letter(  # the turn's attempts, not the message's
                lane, message, reason, error, attempt=turn.attempts
            )
            if routed is None:
                return Routed(None, reason)
        self._rows_finished(turn.messages)
        return Routed("dead_lettered", reason)

    def feedback(self, lane: Lane, message: Message, held_keys: Sequence[str]) -> list[Feedback]:
        """How the call went, for the adaptive keys ``message`` held (none if it made none)."""
        call = self._calls.pop((message.tp, message.offset), None)
        policy = lane.spec.throttle
        if call is None or policy is None or not policy.adaptive:
            return []
        duration_s, throttled = call
        return feedback_for(
            held_keys,
            policy.adaptive,
            duration_s=duration_s,
            throttled=throttled is not None,
            retry_after_s=throttled.retry_after_s if throttled is not None else None,
            dependency=throttled.dependency if throttled is not None else None,
        )

    def _adaptive(self, lane: Lane) -> bool:
        """Whether ``lane``'s calls are reported to adaptive throttle keys when released."""
        policy = lane.spec.throttle
        return self._throttled and policy is not None and bool(policy.adaptive)

    def _cpu_pool(self) -> ProcessPool:
        if self._pool is None:
            self._pool = ProcessPool(self._cpu_workers, grace_s=self._cancel_grace_s)
        return self._pool

    async def close(self) -> None:
        """Stop the CPU pool, if one was started."""
        if self._pool is not None:
            await self._pool.close()
