"""One consumer-group member: fetch, fan out per key, run handlers, route failures, commit.

The member is the glue between small collaborators: the transport's :class:`Consumer`,
:class:`~pipeline.runtime.lanes.KeyLanes` (per-key order, bounded concurrency),
:class:`~pipeline.runtime.offsets.PartitionOffsets` (what to commit),
:class:`~pipeline.runtime.flow.FlowControl` (pause above the high-water mark),
:class:`~pipeline.runtime.due.DueGate` (retry tiers wait for their due time),
:class:`~pipeline.runtime.admit.AdmissionGate` (throttled lanes wait for their slots),
:class:`~pipeline.runtime.turns.DebouncedLanes` (one turn per conversation burst),
:mod:`~pipeline.runtime.sojourn` (deadlines and standing queues) and
:class:`~pipeline.runtime.routing.Routing` (retry tiers, dead letters, deferrals).

Delivery guarantee: a message's offset is committed only after its handler returned, skipped it,
or its failure was durably routed to a retry tier or the dead-letter topic. Everything else is
redelivered after a crash or rebalance (at least once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis

from pipeline import headers as h
from pipeline.admission.adaptive import Feedback, feedback_for
from pipeline.admission.fleet import FleetLimits
from pipeline.config import RuntimeSettings
from pipeline.envelope import Message, Position, TopicPartition
from pipeline.errors import (
    DebounceUnavailable,
    PipelineError,
    Skip,
    Throttled,
    TransportError,
    UnknownTopic,
)
from pipeline.logstore import ProcessedMarker
from pipeline.observability.facades import AdmissionMetrics, DebounceMetrics, RuntimeMetrics
from pipeline.retry.parking import lane_parking
from pipeline.retry.router import Router
from pipeline.runtime.admit import AdmissionGate, Admitter, tenant_of
from pipeline.runtime.app import App, Lane
from pipeline.runtime.batch import BatchGate
from pipeline.runtime.context import Context
from pipeline.runtime.cpu import ProcessPool
from pipeline.runtime.due import DueGate
from pipeline.runtime.flow import FlowControl, PauseBook
from pipeline.runtime.guard import RunGuard
from pipeline.runtime.idempotency import IdempotencyGuard
from pipeline.runtime.isolation import Isolation
from pipeline.runtime.lanes import KeyLanes
from pipeline.runtime.offsets import PartitionOffsets
from pipeline.runtime.pressure import ConcurrencyGovernor
from pipeline.runtime.routing import Routing
from pipeline.runtime.sojourn import StandingQueue, deadline_ms, due_since_ms
from pipeline.runtime.stats import Stats
from pipeline.runtime.turns import DebouncedLanes, TurnOutcome
from pipeline.transport.protocol import Consumer, Transport

log = logging.getLogger(__name__)
# Outcomes after which an event's obligation is met (P1): its log row is processed.
_SETTLED = frozenset({"handled", "skipped", "expired", "dead_lettered", "duplicate"})


class Member:
    """Runs an :class:`App`'s lanes as one member of a consumer group."""

    def __init__(
        self,
        app: App,
        transport: Transport,
        group: str,
        settings: RuntimeSettings,
        *,
        lanes: Sequence[str] | None = None,
        redis: Redis | None = None,
        redis_prefix: str = "pl",
        processed: ProcessedMarker | None = None,
        throttle: Admitter | None = None,
        metrics: RuntimeMetrics | None = None,
        turn_metrics: DebounceMetrics | None = None,
        admission_metrics: AdmissionMetrics | None = None,
        fleet: FleetLimits | None = None,
    ) -> None:
        """Prepare the member; :meth:`run` joins the group.

        ``redis`` holds parking (per-key order across retries) and poison counters; without
        it neither is kept. ``processed`` (the ingress log store) is told, in batches, which
        log rows' events are finished: handled, skipped, expired or dead-lettered.
        ``throttle`` admits the messages of lanes with a ``throttle:`` policy (the caller
        starts and closes it); without it those lanes run unthrottled. ``metrics`` and
        ``turn_metrics`` receive every delivery and debounced turn (Prometheus facades).
        ``fleet`` (dynamic per-org limits) is told of every throttled job and ticks while the
        member runs.
        """
        self.app = app
        self.group = group
        self.stats = Stats()
        self._transport = transport
        self._settings = settings
        self._topics = app.topics(lanes)
        self._offsets: dict[TopicPartition, PartitionOffsets] = {}
        self._lanes = KeyLanes(self._process, settings.max_concurrency)
        self._producer = transport.producer()
        self._router = Router(self._producer)
        self._consumer: Consumer | None = None
        self._flow: FlowControl | None = None
        self._pauses: PauseBook | None = None
        self._due: DueGate | None = None
        self._committed: dict[TopicPartition, Position] = {}
        self._calls: dict[tuple[TopicPartition, int], tuple[float, Throttled | None]] = {}
        """Duration and Throttled error of handler calls on adaptive lanes, until released."""
        self._pool: ProcessPool | None = None
        self._processed = processed
        self._finished_rows: list[str] = []
        self._guard = IdempotencyGuard(redis, redis_prefix) if redis is not None else None
        chosen = [app.lanes[name] for name in lanes or sorted(app.lanes)]
        self._fleet = fleet
        if fleet is not None:
            fleet.bind(lambda: (self._lanes.running, self._lanes.limit))
        self._batch = BatchGate(self._submit_now, self._load)
        self._batch_slas = {
            lane.name: lane.spec.batch.sla_ms / 1000 for lane in chosen if lane.spec.batch
        }
        self._batch_topics = {t for lane in chosen if lane.spec.batch for t in lane.topics}
        self._standing = {
            lane.name: StandingQueue(lane.spec.sojourn) for lane in chosen if lane.spec.sojourn
        }
        debounced = [lane for lane in chosen if lane.turns]
        self._turns: DebouncedLanes | None = None
        if debounced and redis is not None:
            self._turns = DebouncedLanes(
                redis,
                redis_prefix,
                debounced,
                self._settle_turn,
                max_concurrency=settings.max_concurrency,
            )
        elif debounced:
            log.warning("no Redis: debounced lanes run every message as a turn of its own")
        self._metrics = metrics
        self._turn_metrics = turn_metrics
        self._admission_metrics = admission_metrics
        self.polling = asyncio.Event()
        """Set once the member's first poll returned (it is in the group and fetching)."""
        self._gate: AdmissionGate | None = None
        self._deferring: set[tuple[TopicPartition, int]] = set()
        if throttle is not None:
            self._gate = AdmissionGate(throttle, self._admitted, self._defer)
        self._routing = Routing(self._router, self.stats, app.retryable, chosen, metrics)
        specs = [lane.spec for lane in chosen]
        parking = lane_parking(redis, redis_prefix, specs) if redis is not None else {}
        self._guard_runs = RunGuard(
            parking, self._routing, self.stats, Isolation(settings.suspect_alone_s)
        )

    @property
    def batch_waiting(self) -> int:
        """Messages of batch lanes held back until there is idle capacity."""
        return self._batch.waiting

    @property
    def assignment(self) -> list[TopicPartition]:
        """The partitions this member owns now (empty until it joined the group)."""
        return sorted(self._offsets)

    # -- the loop -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set, then shut down gracefully."""
        consumer = self._transport.consumer(self.group, self._topics, listener=self)
        self._consumer = consumer
        self._pauses = PauseBook(consumer)
        self._flow = FlowControl(
            self._pauses, self._settings.partition_high_water, self._settings.partition_low_water
        )
        self._due = DueGate(self._pauses, self._submit)
        self._lanes.start()
        committer = asyncio.create_task(self._commit_forever())
        turns_stop = asyncio.Event()
        runners = [
            asyncio.create_task(runner.run(turns_stop))
            for runner in (self._turns.runners.values() if self._turns else ())
        ]
        if self._settings.pressure.enabled:
            governor = ConcurrencyGovernor(
                self._settings.pressure, self._settings.max_concurrency, self._set_limit
            )
            runners.append(asyncio.create_task(governor.run(turns_stop)))
        if self._fleet is not None:
            runners.append(asyncio.create_task(self._fleet.run(turns_stop)))
        try:
            while not stop.is_set():
                try:
                    batch = await consumer.poll(self._settings.poll_max, 0.5)
                except UnknownTopic:
                    raise  # a configuration error: `pipeline topics apply` was not run
                except TransportError as exc:
                    # A broker blip must not end the member: wait a moment and poll again.
                    log.warning("poll failed, retrying: %s", exc)
                    await asyncio.sleep(0.5)
                    continue
                self.polling.set()
                for message in batch:
                    self._dispatch(message)
        finally:
            turns_stop.set()
            await self._shutdown(committer, runners)

    async def _shutdown(
        self, committer: asyncio.Task[None], runners: Sequence[asyncio.Task[None]] = ()
    ) -> None:
        """Stop fetching, let in-flight work finish within the grace period, commit, leave."""
        self._routing.stopping = True
        consumer = self._consumer
        assert consumer is not None  # noqa: S101 - run() set it
        consumer.pause(sorted(self._offsets))
        if runners:  # running turns finish within the grace period; unfinished ones run again
            _, late = await asyncio.wait(runners, timeout=self._settings.shutdown_grace_s)
            for task in late:
                task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._lanes.wait_idle(), self._settings.shutdown_grace_s)
        committer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await committer
        with contextlib.suppress(TransportError):
            await self._commit(consumer)
        await consumer.close()  # revokes what is left through on_revoked
        await self._lanes.close()
        if self._gate is not None:
            await self._gate.close()
        if self._pool is not None:
            await self._pool.close()
        with contextlib.suppress(TransportError):
            await self._producer.close()

    def _dispatch(self, message: Message) -> None:
        offsets = self._offsets.get(message.tp)
        if offsets is None:  # fetched before its partition was revoked
            return
        if offsets.already_done(message.offset):
            offsets.skipped(message.offset)
            self.stats.already_done += 1
            return
        offsets.started(message.offset)
        assert self._flow is not None  # noqa: S101 - set in run()
        self._flow.added(message.tp)
        if h.DUE_MS in message.headers:
            assert self._due is not None  # noqa: S101
            self._due.offer(message)
        else:
            self._submit(message)

    def _submit(self, message: Message) -> None:
        lane = self.app.lane_of(message.topic)
        if lane.spec.batch is not None:
            self._batch.offer(message, lane.name, lane.spec.batch)
        else:
            self._submit_now(message)

    def _submit_now(self, message: Message) -> None:
        lane = self.app.lane_of(message.topic)
        policy = lane.spec.throttle
        if policy is None or self._gate is None:
            self._lanes.submit(message, ordered=lane.spec.ordered)
            return
        if self._fleet is not None:
            self._fleet.submitted(tenant_of(message))
        self._gate.offer(
            message,
            policy,
            lane.name,
            ordered=lane.spec.ordered,
            busy=lane.spec.ordered and self._lanes.busy(message),
            can_defer=bool(lane.routes.retry_topics),
        )

    def _admitted(self, message: Message) -> None:
        self._lanes.submit(message, ordered=self.app.lane_of(message.topic).spec.ordered)

    def _defer(self, message: Message) -> None:
        """Too many wait for admission: send ``message`` through the first tier, key parked."""
        self._deferring.add((message.tp, message.offset))
        self._admitted(message)

    # -- processing ---------------------------------------------------------------------------

    async def _process(self, message: Message) -> None:
        lane = self.app.lane_of(message.topic)
        attempt = h.int_header(message.headers, h.ATTEMPT, 1)
        started = time.perf_counter()
        outcome = await self._guard_runs.run(
            lane, message, lambda: self._run_handler(lane, message, attempt)
        )
        if outcome is not None:  # None: it could not be routed; leave it for redelivery
            offsets = self._offsets.get(message.tp)
            if offsets is not None:
                offsets.finished(message.offset)
            row = message.headers.get(h.ROW_ID)
            if row is not None and outcome in _SETTLED and self._processed is not None:
                self._finished_rows.append(row.decode())
        if self._flow is not None:
            self._flow.removed(message.tp)
        if self._gate is not None:
            self._gate.finished(message, self._feedback(lane, message))
            if self._fleet is not None and lane.spec.throttle is not None:
                self._fleet.finished(tenant_of(message), time.perf_counter() - started)
        if self._batch.waiting:
            self._batch.pump()
            self._deferring.discard((message.tp, message.offset))  # whatever parking decided
        if self._metrics is not None:
            self._metrics.delivered(lane.name, outcome or "unrouted", time.perf_counter() - started)
        log.debug(
            "delivery",
            extra={
                "topic": message.topic,
                "partition": message.partition,
                "offset": message.offset,
                "key": message.key,
                "attempt": attempt,
                "outcome": outcome,
                "duration_s": time.perf_counter() - started,
            },
        )

    def _expired(self, lane: Lane, message: Message) -> str | None:
        """Why ``message`` must not run now (``expired`` or ``shed``), or None to run it."""
        now_ms = int(time.time() * 1000)
        deadline = deadline_ms(message, lane.spec)
        if deadline is not None and now_ms > deadline:
            self.stats.expired += 1
            log.info(
                "expired %s@%d (deadline %d, %d ms ago)",
                message.tp,
                message.offset,
                deadline,
                now_ms - deadline,
            )
            return "expired"
        standing = self._standing.get(lane.name)
        if standing is not None and not standing.admit(now_ms - due_since_ms(message), now_ms):
            self.stats.shed += 1
            log.info(
                "shed %s@%d: lane %s has a standing queue", message.tp, message.offset, lane.name
            )
            return "shed"
        return None

    async def _not_now(self, lane: Lane, message: Message) -> tuple[bool, str | None]:
        """Whether ``message`` must not run now (deferred, expired or shed), and its outcome."""
        if self._deferring and (message.tp, message.offset) in self._deferring:
            return True, await self._routing.divert(lane, message, "deferred")
        reason = self._expired(lane, message)
        if reason is None:
            return False, None
        if self._metrics is not None:
            self._metrics.expired(lane.name)
        if lane.spec.on_expiry == "drop":
            return True, "expired"
        return True, await self._routing.dead_letter(lane, message, reason, None)

    async def _run_handler(self, lane: Lane, message: Message, attempt: int) -> str | None:
        stop, outcome = await self._not_now(lane, message)
        if stop:
            return outcome
        self._routing.processed(lane)
        called = time.perf_counter()
        try:
            event = lane.decode(message)
            if lane.turns:
                return await self._buffer(lane, event, message, attempt)
            if lane.cpu_ref is None:
                await lane.handler(event, Context(message, lane.name, attempt, self._guard))
            else:
                context = Context(message, lane.name, attempt)  # no Redis in the worker
                await self._cpu_pool().run(lane.cpu_ref, (event, context), lane.time_limit_s)
        except Skip:
            self.stats.skipped += 1
            return "skipped"
        except Exception as exc:  # every handler failure is routed, none escapes
            if isinstance(exc, Throttled) and self._adaptive(lane):  # other failures: no signal
                self._calls[(message.tp, message.offset)] = (time.perf_counter() - called, exc)
            return await self._routing.failure(lane, message, attempt, exc)
        if self._adaptive(lane):
            self._calls[(message.tp, message.offset)] = (time.perf_counter() - called, None)
        self.stats.handled += 1
        return "handled"

    async def _buffer(self, lane: Lane, event: Any, message: Message, attempt: int) -> str:
        """Record a debounced lane's message for its conversation's turn (fail open)."""
        if self._turns is not None:
            try:
                await self._turns.record(lane, event, message)
            except DebounceUnavailable:
                pass  # logged and counted by the debouncer; the message is its own turn
            else:
                self.stats.buffered += 1
                return "buffered"
        await lane.handler([event], Context(message, lane.name, attempt, self._guard))
        self.stats.handled += 1
        self.stats.turns += 1
        return "handled"

    async def _settle_turn(self, lane: Lane, turn: TurnOutcome) -> bool:
        """Count a finished turn, dead-letter it if it failed for good; False: run it again."""
        if turn.outcome in ("handled", "skipped"):
            self.stats.turns += 1
            if self._turn_metrics is not None:
                self._turn_metrics.turn(lane.name, len(turn.messages), turn.lateness_s)
            if turn.outcome == "handled":
                self.stats.handled += len(turn.messages)
            else:
                self.stats.skipped += len(turn.messages)
            self._finished(turn.messages)
            return True
        error = turn.error
        fatal = error is not None and not self.app.retryable(error)
        if turn.outcome == "failed" and not fatal:
            self.stats.turn_retries += 1
            return False
        reason = "fatal" if fatal else "exhausted"
        for message in turn.messages:  # in order: a sequenced dead letter
            routed = await self._routing.dead_letter(lane, message, reason, error)
            if routed is None:
                return False
        self._finished(turn.messages)
        return True

    def _finished(self, messages: Sequence[Message]) -> None:
        if self._processed is None:
            return
        for message in messages:
            row = message.headers.get(h.ROW_ID)
            if row is not None:
                self._finished_rows.append(row.decode())

    def _cpu_pool(self) -> ProcessPool:
        if self._pool is None:
            self._pool = ProcessPool(self._settings.cpu_workers)
        return self._pool

    # -- offsets ------------------------------------------------------------------------------

    async def _commit_forever(self) -> None:
        while True:
            await asyncio.sleep(self._settings.commit_interval_ms / 1000)
            if self._consumer is not None:
                try:
                    await self._commit(self._consumer)
                except TransportError as exc:
                    log.warning("periodic commit failed: %s", exc)

    def _positions(self, tps: Sequence[TopicPartition]) -> list[Position]:
        out = []
        for tp in tps:
            offsets = self._offsets.get(tp)
            if offsets is None:
                continue
            position = offsets.position()
            if self._committed.get(tp) != position:
                out.append(position)
        return out

    def _adaptive(self, lane: Lane) -> bool:
        """Whether ``lane``'s calls are reported to adaptive throttle keys when released."""
        policy = lane.spec.throttle
        return self._gate is not None and policy is not None and bool(policy.adaptive)

    def _feedback(self, lane: Lane, message: Message) -> list[Feedback]:
        """How the call went, for the adaptive keys ``message`` held (none if it made none)."""
        call = self._calls.pop((message.tp, message.offset), None)
        policy = lane.spec.throttle
        if call is None or policy is None or not policy.adaptive or self._gate is None:
            return []
        duration_s, throttled = call
        return feedback_for(
            self._gate.held_keys(message),
            policy.adaptive,
            duration_s=duration_s,
            throttled=throttled is not None,
            retry_after_s=throttled.retry_after_s if throttled is not None else None,
            dependency=throttled.dependency if throttled is not None else None,
        )

    def _set_limit(self, limit: int) -> None:
        self._lanes.limit = limit

    def _load(self) -> tuple[int, int]:
        """Handlers in use or queued in the key lanes, and the concurrency limit."""
        return self._lanes.buffered, self._lanes.limit

    def _report(self) -> None:
        """Publish the gauges: busy slots, and who waits for admission per lane."""
        if self._batch.waiting:
            self._batch.pump()  # promotion is by age: look again on every tick
        if self._metrics is not None:
            batch = [tp for tp in self._offsets if tp.topic in self._batch_topics]
            busy = self._lanes.running - (self._lanes.running_on(batch) if batch else 0)
            self._metrics.slots(busy, self._lanes.limit)  # batch work never asks to scale up
            for name, sla_s in self._batch_slas.items():
                self._metrics.batch_lane(name, sla_s, self._batch.waiting_in(name))
        if self._admission_metrics is None or self._gate is None:
            return
        by_lane: dict[str, dict[str, int]] = {
            name: {} for name, lane in self.app.lanes.items() if lane.spec.throttle
        }
        for (lane, tenant), count in self._gate.waiting_by.items():
            by_lane.setdefault(lane, {})[tenant] = count
        for lane, tenants in by_lane.items():
            self._admission_metrics.waiting(lane, sum(tenants.values()))
            self._admission_metrics.throttled_tenants(lane, tenants)

    async def _mark_processed(self) -> None:
        """Tell the log store which rows are finished (one batch per commit tick)."""
        if self._processed is None or not self._finished_rows:
            return
        rows, self._finished_rows = self._finished_rows, []
        try:
            await self._processed.mark_processed(rows)
        except PipelineError as exc:
            log.warning("could not mark %d log rows processed: %s", len(rows), exc)
            self._finished_rows = rows + self._finished_rows

    async def _commit(self, consumer: Consumer) -> None:
        self._report()
        # Positions first: every offset about to be committed has its log row in the batch
        # marked now, so a crash after the commit cannot leave a handled row unmarked.
        positions = self._positions(sorted(self._offsets))
        await self._mark_processed()
        if positions:
            await consumer.commit(positions)
            for position in positions:
                self._committed[position.tp] = position

    # -- rebalance listener ---------------------------------------------------------------------

    async def on_assigned(
        self, partitions: Sequence[TopicPartition], committed: Mapping[TopicPartition, Position]
    ) -> None:
        """Start tracking new partitions from the group's committed positions."""
        for tp in partitions:
            self._offsets[tp] = PartitionOffsets(tp, committed.get(tp))
            if tp in committed:
                self._committed[tp] = committed[tp]
        log.info("%s assigned %s", self.group, [f"{tp.topic}[{tp.partition}]" for tp in partitions])

    async def on_revoked(
        self, partitions: Sequence[TopicPartition], *, lost: bool
    ) -> Sequence[Position]:
        """Drop queued work of leaving partitions, let running work finish, return positions."""
        tps = set(partitions)
        self._lanes.drop(tps)
        if self._due is not None:
            self._due.drop(tps)
        self._batch.drop(tps)
        if not lost:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lanes.wait_idle(tps), self._settings.shutdown_grace_s)
        if self._gate is not None:
            self._gate.drop(tps)
        positions = [] if lost else self._positions(sorted(tps))
        for tp in tps:
            self._offsets.pop(tp, None)
            self._committed.pop(tp, None)
            if self._flow is not None:
                self._flow.forget(tp)
            if self._pauses is not None:
                self._pauses.forget(tp)
        log.info("%s revoked %s (lost=%s)", self.group, sorted(tps), lost)
        return positions
