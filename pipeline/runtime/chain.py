"""The path of a message through a member, stage by stage, in one place.

::

    poll ─▶ due ─▶ batch ─▶ throttle ─▶ key lanes ─▶ guard ─▶ cancel ─▶ handler ─▶ settle

* **due** (:class:`~pipeline.runtime.due.DueGate`): a retry-tier message waits until its due
  time (its partition paused once it holds many); others pass, a main-topic message carrying
  ``pl-due-ms`` too (only the retry router writes it, on tiers: held, it would let its key's
  later messages overtake it).
* **batch** (:class:`~pipeline.runtime.batch.BatchGate`): a batch lane's message waits for idle
  capacity or its SLA's promotion point; others pass.
* **throttle** (:class:`~pipeline.runtime.throttle_gate.ThrottleGate`): a throttled lane's message
  waits for its slots in Redis, or is deferred through the first retry tier; others pass.
* **key lanes** (:class:`~pipeline.runtime.lanes.KeyLanes`): one message of a key at a time,
  in order; different keys run concurrently up to the member's limit, in turn, but a
  retry-tier copy the due stage released goes ahead of the keys waiting for a worker.
* **guard** (:class:`~pipeline.runtime.guard.RunGuard`): start marks and parking in Redis;
  decides whether the message runs, is held behind its key's head, or is a stale copy.
* **cancel** (:class:`~pipeline.runtime.longwork.LongWork`): a message whose work was cancelled
  ends ``cancelled`` without running; others run in their key lane's task, which it can stop
  (heartbeats, hung runs). It sits after the guard, so retry-tier copies and released parked
  followers pass it too, and a cancelled head still ends its key's parking.
* **handler** (:class:`~pipeline.runtime.handling.HandlerStage`): the user's handler, and the
  routing of its failure to a retry tier or the dead-letter topic.
* **settle**: the member records the outcome (offsets to commit, log rows, metrics).

The due and batch stages judge times other hosts wrote (a due time, a produce time) by the
chain's clock: in a member with Redis, Redis's
(:class:`~pipeline.runtime.shared_clock.SharedClock`).

A :class:`~pipeline.runtime.work.Work` carries the message and its lane (looked up once, on
entry) from stage to stage. Each stage is told only of its successor, by the hop methods below,
so the order is visible here and a stage can change without reading the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pipeline import headers as h
from pipeline import tracing
from pipeline.admission.fleet import FleetLimits
from pipeline.envelope import Message, TopicPartition
from pipeline.log_repeats import JUDGED, RepeatFilter, shown_now
from pipeline.runtime.app import App, Lane
from pipeline.runtime.batch import BatchGate
from pipeline.runtime.due import DueGate
from pipeline.runtime.flow import PauseBook, SentAway
from pipeline.runtime.guard import RunGuard, ordered_retries
from pipeline.runtime.handling import HandlerStage
from pipeline.runtime.lanes import KeyLanes
from pipeline.runtime.offsets import PartitionOffsets
from pipeline.runtime.shared_clock import local_ms
from pipeline.runtime.sojourn import deadline_ms
from pipeline.runtime.throttle_gate import SPILL_MIN_WAITING, Admitter, ThrottleGate, tenant_of
from pipeline.runtime.work import Work

log = logging.getLogger(__name__)

Settle = Callable[[Work, str | None, float], None]
"""The member's last step: record a message's outcome (None: it could not be routed) and how
long its guard and handler took, in seconds."""


class Chain:
    """The stages between a member's poll and its commit, wired in order."""

    def __init__(
        self,
        app: App,
        *,
        max_concurrency: int,
        guard: RunGuard,
        handler: HandlerStage,
        settle: Settle,
        throttle: Admitter | None = None,
        fleet: FleetLimits | None = None,
        group: str = "",
        clock_ms: Callable[[], int] = local_ms,
        parks: Callable[[str], bool] | None = None,
    ) -> None:
        """Build the stages; :meth:`start` binds the due stage to the consumer's pauses.

        ``parks(lane)``: whether the run guard parks ``lane``'s keys in Redis (None: every
        ordered lane with retry tiers, as in a member with Redis). Only there may a partition
        paused full send a flood's keys away (:meth:`spill`).

        ``group``: the consumer group, named on each delivery's ``process`` span.
        ``clock_ms``: now in ms since the epoch, by which due times and batch promotion are
        judged.
        """
        self._app = app
        self._clock_ms = clock_ms
        self._group = group
        self._guard = guard
        self._handler = handler
        self._settle = settle
        self._fleet = fleet
        self._parks = parks
        self._repeats = RepeatFilter()  # a flood's spill lines, backed off per lane
        self.lanes: KeyLanes[Work] = KeyLanes(self._run, max_concurrency)
        self.batch: BatchGate[Work] = BatchGate(self._throttle, self._load, clock_ms)
        self.gate: ThrottleGate[Work] | None = None
        if throttle is not None:
            self.gate = ThrottleGate(throttle, self._key_lanes, self._defer)
        self.due: DueGate[Work] | None = None
        self._due_ignored: set[str] = set()
        """Lanes whose main topic brought a ``pl-due-ms`` (logged once per lane)."""

    def start(self, pauses: PauseBook) -> None:
        """Start the key lanes' workers; the due stage pauses partitions through ``pauses``."""
        self.due = DueGate(pauses, self._due, self._clock_ms)
        self.lanes.start()

    # -- the hops, in order -------------------------------------------------------------------

    def enter(self, message: Message, offsets: PartitionOffsets | None = None) -> None:
        """A polled message enters the chain with its lane (and its partition's ``offsets``)."""
        lane = self._app.lane_of(message.topic)
        work = Work(message, lane, offsets=offsets)
        work.trace = tracing.process(message, lane.name, self._group)
        if h.DUE_MS in message.headers:
            if h.retry_tier(message.topic):
                assert self.due is not None  # noqa: S101 - start() ran before the first poll
                self.due.offer(work, max(lane.routes.backoff.tiers_ms, default=0))
                return
            self._not_due(work)
        self._batch(work)

    def _not_due(self, work: Work) -> None:
        """A main-topic message carries ``pl-due-ms``: no retry copy, it runs as new work.

        Some producer other than the retry router wrote it (a copy pasted back, a replay tool,
        a tenant). Held until that time, the key's later messages would overtake it. Said once
        per lane, at debug: any producer can send it on every message.
        """
        lane = work.lane.name
        if lane not in self._due_ignored:
            self._due_ignored.add(lane)
            log.debug(
                "lane %s: %s@%d carries %s on the lane's main topic: ignored, it runs as new"
                " work (only copies read from a retry tier have a due time); not said again",
                lane,
                work.tp,
                work.offset,
                h.DUE_MS,
            )

    def _due(self, work: Work) -> None:
        """A retry-tier copy whose delay is over: it goes ahead of the keys waiting for a worker.

        It is older than anything the member buffered since it failed, and its tier's delay is
        all it should wait: behind the buffer (up to ``partition_high_water`` messages a
        partition) it would wait that long again. On an ordered lane its key's later messages
        also wait parked behind it. A key with messages queued keeps its place and order.
        """
        work.due = True
        self._batch(work)

    def _batch(self, work: Work) -> None:
        policy = work.lane.spec.batch
        if policy is not None:
            self.batch.offer(work, work.lane.name, policy, copy=work.due)
        else:
            self._throttle(work)

    def _throttle(self, work: Work) -> None:
        spec = work.lane.spec
        if spec.throttle is None or self.gate is None:
            self._key_lanes(work)
            return
        if self._fleet is not None:
            self._fleet.submitted(tenant_of(work))
        can_defer = bool(work.lane.routes.retry_topics) and not work.due
        self.gate.offer(
            work,
            spec.throttle,
            work.lane.name,
            ordered=spec.ordered,
            busy=spec.ordered and self.lanes.busy(work),
            can_defer=can_defer,
            can_spill=can_defer and self._parks_keys(work.lane),
        )

    def _parks_keys(self, lane: Lane) -> bool:
        """Whether ``lane``'s keys are parked in Redis when one of its messages is deferred."""
        if not ordered_retries(lane):
            return False
        return self._parks is None or self._parks(lane.name)

    def spill(self, tp: TopicPartition, count: int, batch: SentAway) -> int:
        """``tp`` is full: send about ``count`` of its waiting messages away.

        First the waiting messages of the tenant holding most of the partition in the throttle
        gate (:meth:`ThrottleGate.spill`), then, if that is not enough, the messages queued in
        the key lanes behind the heads of the partition's hot keys (each holding half of what
        must still go or more: a hot conversation of a lane without a throttle), left in place
        and marked to be deferred when their turn comes: the first parks its key, the others
        are held behind it in Redis. Either way the partition reads on for the other keys. Each
        is marked ``sent_away`` with ``batch``; returns how many went.
        """
        sent = 0
        if self.gate is not None:
            for work in self.gate.spill(tp, count):
                work.sent_away = batch
                sent += 1
        queued = 0
        if sent < count:
            # Only a hot key's: one holding half of what must go. A backlog drained fast
            # has a few messages queued behind each head, which would only go round for
            # nothing.
            least = max(SPILL_MIN_WAITING, (count - sent) // 2)
            for work in self.lanes.queued_of(tp, count - sent, self._may_leave, least=least):
                self._handler.deferred[id(work.message)] = work.message
                work.sent_away = batch
                queued += 1
        if sent or queued:
            self._tell_spill(tp, sent, queued)
        return sent + queued

    def _tell_spill(self, tp: TopicPartition, waiting: int, queued: int) -> None:
        """One INFO line a lane for a spill, repeats backed off (a flood spills again and again)."""
        lane = self._app.lane_of(tp.topic).name
        held = shown_now(self._repeats, log, f"lane {lane}: partition full, messages sent away")
        if held is None:
            return
        log.info(
            "lane %s: %s[%d] is full (partition_high_water): %d message(s) waiting for a throttle"
            " slot and %d queued behind a hot key sent away, the first of each key through the"
            " first retry tier and the rest held behind it in Redis, so the partition's other"
            " keys are read%s",
            lane,
            tp.topic,
            tp.partition,
            waiting,
            queued,
            held,
            extra={JUDGED: True},  # backed off here
        )

    def _may_leave(self, work: Work) -> bool:
        """Whether ``work``, queued in the key lanes, may be sent away from a full partition.

        Not a copy back from a retry tier (it would go round again), not one already on its
        way out, and only on a lane whose keys park in Redis, that neither coalesces turns nor
        waits for idle capacity.
        """
        lane = work.lane
        return (
            not work.due
            and work.sent_away is None
            and id(work.message) not in self._handler.deferred
            and not lane.turns
            and lane.spec.batch is None
            and self._parks_keys(lane)
        )

    def _defer(self, work: Work) -> None:
        """Too many wait for admission: it goes through the first tier, its key parked.

        It waits for a worker behind the keys with work to run (``leaving``), though one pick
        in :data:`~pipeline.runtime.lanes.LEAVING_EVERY` takes such a key while both wait.
        """
        self._handler.deferred[id(work.message)] = work.message
        self._key_lanes(work, leaving=True)

    def _key_lanes(self, work: Work, *, leaving: bool = False) -> None:
        if work.trace is not None and self.gate is not None and work.lane.spec.throttle:
            tracing.admitted(work.trace)  # the end of its throttle wait
        self.lanes.submit(work, ordered=work.lane.spec.ordered, first=work.due, leaving=leaving)

    async def _run(self, work: Work) -> None:
        """Guard and handler (the guard calls the handler stage), then release and settle.

        Whatever raises on the way (a bug, a user's ``retryable`` or a ``Throttled`` whose
        ``retry_after_s`` is no number) is logged naming the message, and the message is still
        released and settled: its throttle slots freed, its key's next message let through, an
        unfinished run left for redelivery. Otherwise its slots would stay held for as long as
        the member lives, its key's later messages waiting for them, and the offset of a
        message its handler had finished would never be committed.
        """
        started = time.perf_counter()
        deferred = self._handler.deferred
        if deferred and id(work.message) in deferred and self._expired(work):
            del deferred[id(work.message)]  # the handler stage expires it rather than send it
        if self.gate is not None and work.trace is not None and work.lane.spec.throttle:
            policy = work.lane.spec.throttle
            tracing.throttle_waited(work.trace, self.gate.held_keys(work), policy.priority)
        trace = work.trace
        try:
            if trace is None:
                outcome = await self._guard.run(work.lane, work.message)
            else:
                token = tracing.guard_entered(trace)
                try:
                    outcome = await self._guard.run(work.lane, work.message)
                finally:
                    tracing.guard_left(trace, token)
        except Exception as exc:
            _failed(work, exc, "failed before it was routed; it is left for redelivery")
            outcome = None
        try:
            self._release(work, started)
        except Exception as exc:
            _failed(work, exc, f"could not be released after it ended {outcome or 'unrouted'}")
        try:
            self._settle(work, outcome, time.perf_counter() - started)
            if work.trace is not None:
                tracing.finish(work.trace, outcome)
        except Exception as exc:
            _failed(work, exc, f"could not be settled after it ended {outcome or 'unrouted'}")

    def _expired(self, work: Work) -> bool:
        """Whether ``work``'s message is past its deadline (``max_age``, ``pl-deadline-ms``).

        A message deferred when its turn came (a spill, an over-share deferral) would go through
        the first tier unexpired, and its copy, whose ``max_age`` counts from its due time,
        would run: an expired message would run for having been sent away. Unmarked, it
        expires in the handler stage (or, held behind its parked key, when it is released).
        """
        deadline = deadline_ms(work.message, work.lane.spec)
        return deadline is not None and self._clock_ms() > deadline

    def _release(self, work: Work, started: float) -> None:
        """A message is done: its throttle slots (with their feedback) and its batch lane."""
        if self.gate is not None:
            lane, message = work.lane, work.message
            try:
                feedback = self._handler.feedback(lane, message, self.gate.held_keys(work))
            except Exception as exc:
                _failed(work, exc, "got no throttle feedback; its slots are released without it")
                feedback = []
            self.gate.finished(work, feedback)
            if self._fleet is not None and lane.spec.throttle is not None:
                self._fleet.finished(tenant_of(work), time.perf_counter() - started)
        if self.batch.any_waiting:
            self.batch.pump()
        deferred = self._handler.deferred
        if deferred:
            deferred.pop(id(work.message), None)  # whatever parking decided

    # -- revocation ---------------------------------------------------------------------------

    def drop(self, partitions: set[TopicPartition]) -> list[Work]:
        """Forget the queued (not running) work of revoked ``partitions``; returns the lanes'.

        The key lanes' queued work and the throttle gate's waiting messages go at once, the
        gate's acquisitions withdrawn and the slots of admitted work that will not run given
        back; a run still going keeps its slots until it ends. Dropped from the key lanes only,
        a message whose slots came while the revocation waited for the partition's runs was
        queued after the drop and, once the wait ran out, ran after the revocation beside the
        partition's next owner, its slots already given back.

        A deferred message among the work goes unrun (the partition's next owner reads it
        again), so its mark goes too: kept, it would stay for the process's life. A run still
        going keeps its own (a mark belongs to the message object, not to its offset).
        """
        dropped = self.lanes.drop(partitions)
        running = {(work.tp, work.offset) for work in self.lanes.running_of(partitions)}
        if self.gate is not None:
            self.gate.drop(partitions, running)
        deferred = self._handler.deferred
        if deferred and dropped:
            for work in dropped:
                deferred.pop(id(work.message), None)
        return dropped

    # -- load ---------------------------------------------------------------------------------

    def _load(self) -> tuple[int, int]:
        """Handlers in use or queued in the key lanes, and the concurrency limit."""
        return self.lanes.buffered, self.lanes.limit


def _failed(work: Work, error: Exception, what: str) -> None:
    """Log that ``work``'s message ``what``, in a line naming it and ``error``, then its trace."""
    message = work.message
    log.error(
        "lane %s: message %s[%d]@%d %s: %s: %s",
        work.lane.name,
        message.topic,
        message.partition,
        message.offset,
        what,
        type(error).__name__,
        error,
        exc_info=error,
    )
