"""One consumer-group member: poll, run each message down the chain, commit.

The member wires the chain (``runtime/chain.py``: due → batch → throttle → key lanes → guard →
handler → settle) and runs the loop around it: it polls the transport's :class:`Consumer`,
hands each message to the chain, records each outcome in
:class:`~pipeline.runtime.offsets.PartitionOffsets` and commits on a timer, pauses partitions
above the high-water mark (:class:`~pipeline.runtime.flow.FlowControl`), and answers the group's
rebalances.

Delivery guarantee: a message's offset is committed only after its handler returned, skipped it,
or its failure was durably routed to a retry tier or the dead-letter topic (or it was held
behind its parked key, in Redis). Everything else is redelivered after a crash or rebalance (at
least once).

The member cannot run without its commit loop, its debounced lanes' turn runners and its
long-work tick: the first of them to fail stops it (:mod:`pipeline.runtime.supervision`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from redis.asyncio import Redis

from pipeline import headers as h
from pipeline.admission.fleet import FleetLimits
from pipeline.cancel.functions import CancelFunctions
from pipeline.cancel_tasks import cancel_until_done
from pipeline.config import RuntimeSettings
from pipeline.envelope import Message, Position, TopicPartition, printable
from pipeline.errors import ConfigError, PipelineError, TransportError, UnknownTopic
from pipeline.logstore import ProcessedMarker
from pipeline.observability.deletion_cost import DeletionCost
from pipeline.observability.facades import AdmissionMetrics, DebounceMetrics, RuntimeMetrics
from pipeline.offload.writer import offloading
from pipeline.retry.guard_store import GuardStore, lane_guards
from pipeline.retry.router import RetryRouter
from pipeline.runtime.app import App, Lane
from pipeline.runtime.chain import Chain
from pipeline.runtime.claims import LaneClaims
from pipeline.runtime.flow import FlowControl, PauseBook
from pipeline.runtime.guard import RunGuard, ordered_retries
from pipeline.runtime.handling import HandlerStage
from pipeline.runtime.idempotency import IdempotencyGuard, lane_once_ttls
from pipeline.runtime.isolation import Isolation
from pipeline.runtime.lane_lease import LaneLease, LaneTaken, lease_ms
from pipeline.runtime.longwork import LongWork
from pipeline.runtime.offsets import PartitionOffsets
from pipeline.runtime.pressure import ConcurrencyGovernor
from pipeline.runtime.progress import partitions_text
from pipeline.runtime.protection import ScaleInProtection
from pipeline.runtime.redirect import Redirector
from pipeline.runtime.shared_clock import SharedClock
from pipeline.runtime.stats import Stats
from pipeline.runtime.supervision import Essential
from pipeline.runtime.throttle_gate import Admitter
from pipeline.runtime.turns import DebouncedLanes
from pipeline.runtime.work import Work
from pipeline.topics.spec import format_duration_ms
from pipeline.transport.protocol import Consumer, Transport

log = logging.getLogger(__name__)
_STOP_MARGIN_S = 5.0
"""How long past ``cancel_grace_s`` shutdown waits for cancelled runs to end (a ``cpu=True``
run's worker is killed after that grace, then replaced): one deadline for all of them."""
_GIVE_UP_FLOOR_S = 1.0
"""How long shutdown lets revoked partitions whose runs ended give up their claims (Redis
calls under way), when waiting for a run that did not end used the stop deadline up."""


def longest_stop_s(settings: RuntimeSettings) -> float:
    """The longest a member's shutdown waits for its work, in seconds.

    The handler grace, the cancel grace and its margin, and the claims' floor; the last commit
    and leaving the group come after.
    """
    return settings.shutdown_grace_s + settings.cancel_grace_s + _STOP_MARGIN_S + _GIVE_UP_FLOOR_S


# Outcomes after which an event's obligation is met (P1): its log row is processed.
_SETTLED = frozenset({"handled", "skipped", "expired", "dead_lettered", "duplicate", "cancelled"})


class Member:
    """Runs an :class:`App`'s lanes as one member of a consumer group."""

    abandoned: int = 0
    """Runs still going at the end of shutdown: their handlers ignored their cancellation."""
    _deadline_s: float | None = None
    """When shutdown's grace ends (event loop time); None until shutdown starts."""
    _hurry: asyncio.Event | None = None
    """Set to end shutdown's grace at once (a second signal); see :meth:`run`."""

    def __init__(  # noqa: PLR0915 - the wiring of every stage, one statement each
        self,
        app: App,
        transport: Transport,
        group: str,
        settings: RuntimeSettings,
        *,
        lane_names: Sequence[str] | None = None,
        redis: Redis | None = None,
        redis_prefix: str = "pl",
        processed: ProcessedMarker | None = None,
        throttle: Admitter | None = None,
        metrics: RuntimeMetrics | None = None,
        turn_metrics: DebounceMetrics | None = None,
        admission_metrics: AdmissionMetrics | None = None,
        fleet: FleetLimits | None = None,
        deletion_cost: DeletionCost | None = None,
        instance: str | None = None,
    ) -> None:
        """Prepare the member; :meth:`run` joins the group.

        ``redis`` holds parking (per-key order across retries) and poison counters; without
        it neither is kept. ``processed`` (the ingress log store) is told, in batches, which
        log rows' events are finished: handled, skipped, expired or dead-lettered.
        ``throttle`` admits the messages of lanes with a ``throttle:`` policy (the caller
        starts and closes it); without it those lanes run unthrottled. ``metrics`` and
        ``turn_metrics`` receive every delivery and debounced turn (Prometheus facades).
        ``fleet`` (dynamic per-org limits) is told of every throttled job and ticks while the
        member runs. ``deletion_cost`` (in Kubernetes) publishes the member's long work as its
        Pod's deletion cost (:mod:`pipeline.runtime.protection`). ``instance``, the member's
        stable name, names its hold of its lanes' group leases (a restart under the same name
        takes its old hold over: :class:`LaneLease`).
        """
        self.app = app
        self.group = group
        self.stats = Stats()
        self._transport = transport
        self._settings = settings
        self._topics = app.topics(lane_names)
        chosen = [app.lanes[name] for name in lane_names or sorted(app.lanes)]
        _check_heartbeats(chosen, settings)  # before anything is opened
        self._offsets: dict[TopicPartition, PartitionOffsets] = {}
        self._committed: dict[TopicPartition, Position] = {}
        self._producer = transport.producer()
        self._consumer: Consumer | None = None
        self._flow: FlowControl | None = None
        self._pauses: PauseBook | None = None
        self._processed = processed
        self._finished_rows: list[str] = []
        self._metrics = metrics
        self._admission_metrics = admission_metrics
        self._fleet = fleet
        self._batch_slas = {
            lane.name: lane.spec.batch.sla_ms / 1000 for lane in chosen if lane.spec.batch
        }
        self._batch_topics = {t for lane in chosen if lane.spec.batch for t in lane.topics}
        self._main_topics = {lane.spec.name: lane.name for lane in chosen}
        """Each lane's main topic, the topic its lag is read on, and the lane's name."""
        self._heartbeat_timeouts = {  # each lane of long work: its heartbeat timeout (s)
            lane.name: lane.spec.heartbeat_timeout_ms / 1000
            for lane in chosen
            if lane.spec.heartbeat_timeout_ms is not None
        }
        # Due times, failure times and deadlines are read off Redis's clock, whatever this host's.
        self._clock = SharedClock(redis)
        self._routing = Redirector(
            RetryRouter(
                offloading(  # references produced again are kept young for the purge
                    self._producer,
                    [lane.spec for lane in chosen],
                    None if metrics is None else metrics.offload,
                ),
                self._clock.now_ms,
            ),
            self.stats,
            app.retryable,
            chosen,
            metrics,
        )
        idempotency = (  # ctx.once, for messages and debounced turns alike
            IdempotencyGuard(
                redis,
                redis_prefix,
                lease_ms=settings.liveness_ms,
                lane_ttl_ms=lane_once_ttls([lane.spec for lane in chosen]),
            )
            if redis is not None
            else None
        )
        self._handler = HandlerStage(
            app,
            self._routing,
            self.stats,
            chosen,
            cpu_workers=settings.cpu_workers,
            throttled=throttle is not None,
            idempotency=idempotency,
            metrics=metrics,
            turn_metrics=turn_metrics,
            rows_finished=self._rows_finished,
            cancel_grace_s=settings.cancel_grace_s,
            clock_ms=self._clock.now_ms,
        )
        self._longwork = LongWork(
            self._handler,
            self._routing,
            self.stats,
            chosen,
            functions=CancelFunctions(redis, redis_prefix) if redis is not None else None,
            poll_s=settings.cancel_poll_ms / 1000,
            protection=ScaleInProtection(deletion_cost, metrics, max_s=settings.protect_max_s),
            metrics=metrics,
            clock_ms=self._clock.now_ms,
        )
        stores = (
            lane_guards(redis, redis_prefix, [c.spec for c in chosen], live_ms=settings.liveness_ms)
            if redis is not None
            else {}
        )
        self._parking = {
            lane.name: stores[lane.name]
            for lane in chosen
            if lane.name in stores and ordered_retries(lane)
        }
        """The stores of the ordered lanes with retry tiers, where keys are parked."""
        self._guard = RunGuard(
            stores,
            self._routing,
            self.stats,
            Isolation(settings.suspect_alone_s),
            self._longwork,  # the cancel gate, then the handler stage
            self._settled_follower,
            claims=(
                _claims(stores, chosen, settings, self._superseded)
                if settings.guard_claims
                else None
            ),
            checkpoint_s=settings.commit_interval_ms / 1000,
            group=group,
        )
        self._chain = Chain(
            app,
            max_concurrency=settings.max_concurrency,
            guard=self._guard,
            handler=self._handler,
            settle=self._settle,
            throttle=throttle,
            fleet=fleet,
            group=group,
            clock_ms=self._clock.now_ms,
            parks=self._parking.__contains__,
        )
        debounced = [lane for lane in chosen if lane.turns]
        self._turns: DebouncedLanes | None = None
        if debounced and redis is not None:
            self._turns = DebouncedLanes(
                redis,
                redis_prefix,
                debounced,
                self._handler.settle_turn,
                max_concurrency=settings.max_concurrency,
                superseded=None if turn_metrics is None else turn_metrics.superseded,
                idempotency=idempotency,
                cancelled=self._longwork.skips,
                group=group,
            )
            self._handler.turns = self._turns
        elif debounced:
            log.warning("no Redis: debounced lanes run every message as a turn of its own")
        turn_lanes = debounced if self._turns is not None else []
        self._turn_topics = {t for lane in turn_lanes for t in lane.topics}
        """Topics whose messages pass the message slots only to be buffered for a turn."""
        self._message_slots = len(turn_lanes) < len(chosen)
        """Whether a lane of this member runs its handler in the message slots."""
        if fleet is not None:
            lanes_ = self._chain.lanes
            fleet.bind(lambda: (lanes_.running, lanes_.limit))
        self._reap_every = max(1, round(2000 / settings.commit_interval_ms))
        self._lease = (  # a lane is consumed by one group at a time (runtime/lane_lease.py)
            LaneLease(
                redis,
                redis_prefix,
                [lane.spec.lane for lane in chosen],  # the lanes of the guard's keys
                group,
                lease_ms=lease_ms(settings.liveness_ms),
                member=instance,
            )
            if redis is not None
            else None
        )
        self._ticks = 0
        # Tasks of the member's own, each with the partitions whose runs it waits for.
        self._background: dict[asyncio.Task[None], set[TopicPartition]] = {}
        self._rejoining = False
        self.polling = asyncio.Event()
        """Set once the member's first poll returned (it is in the group and fetching)."""

    @property
    def batch_waiting(self) -> int:
        """Messages of batch lanes held back until there is idle capacity."""
        return self._chain.batch.waiting

    @property
    def assignment(self) -> list[TopicPartition]:
        """The partitions this member owns now (empty until it joined the group)."""
        return sorted(self._offsets)

    async def parked_keys(self) -> dict[str, int]:
        """Keys parked now per ordered lane with retry tiers (the group's: one read a lane).

        Raises redis errors (a metrics refresh counts them).
        """
        return {lane: await store.parked_count() for lane, store in self._parking.items()}

    # -- the loop -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, hurry: asyncio.Event | None = None) -> None:
        """Consume until ``stop`` is set, then shut down gracefully.

        ``hurry``, set during the shutdown, ends its grace at once: what still runs is
        cancelled (not committed, so delivered again), then the member commits and leaves.

        A lane held by another group's lease is waited for before the member joins its group;
        one taken by another group while the member runs stops it
        (:mod:`pipeline.runtime.lane_lease`).

        Raises:
            PipelineError: an essential background task (the commit loop, a debounced lane's
                turn runner, the long-work tick) failed; the member shut down as on ``stop``
                (:mod:`pipeline.runtime.supervision`).
        """
        self._hurry = hurry
        if not await self._lanes_held(stop):
            return
        await self._clock.measure()  # Redis's clock, before the first due time is read
        await self._longwork.tick()  # the standing cancellations, before the first message
        consumer = self._transport.consumer(self.group, self._topics, listener=self)
        self._consumer = consumer
        self._pauses = PauseBook(consumer)
        self._flow = FlowControl(
            self._pauses,
            self._settings.partition_high_water,
            self._settings.partition_low_water,
            full=self._chain.spill,
        )
        self._chain.start(self._pauses)
        # Without any of these the member must not run on: the first to fail stops it.
        essential = Essential(f"member of group {self.group}")
        committer = essential.start(self._commit_forever(), "commit loop")
        turns_stop = asyncio.Event()
        runners = [
            essential.start(runner.run(turns_stop), f"debounced lane {name}'s turn runner")
            for name, runner in (self._turns.runners.items() if self._turns else ())
        ]
        if self._settings.pressure.enabled:
            governor = ConcurrencyGovernor(
                self._settings.pressure, self._settings.max_concurrency, self._set_limit
            )
            runners.append(asyncio.create_task(governor.run(turns_stop)))
        if self._fleet is not None:
            runners.append(asyncio.create_task(self._fleet.run(turns_stop)))
        runners.append(asyncio.create_task(self._clock.run(turns_stop)))
        longwork = essential.start(
            self._longwork.run(turns_stop), "long-work tick (heartbeats, cancellations)"
        )
        pause_s = 0.5
        try:
            while not stop.is_set() and not essential.failed.is_set():
                try:
                    batch = await consumer.poll(self._settings.poll_max, 0.5)
                except UnknownTopic:
                    raise  # a configuration error: `pipeline topics apply` was not run
                except TransportError as exc:
                    # A broker blip must not end the member: back off (0.5 s doubling to 5 s,
                    # so an outage is not hammered) and poll again.
                    log.warning("poll failed, retrying in %.1f s: %s", pause_s, exc)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), pause_s)
                    pause_s = min(pause_s * 2, 5.0)
                    continue
                pause_s = 0.5
                self.polling.set()
                await self._claim(batch)  # claimed before any of it runs
                for message in batch:
                    self._dispatch(message)
        finally:
            essential.closing()
            turns_stop.set()
            try:
                await self._shutdown(committer, runners)
                await asyncio.wait([longwork])
                await self._longwork.close()
            finally:
                essential.check()  # a failed essential task: one line, a non-zero exit

    async def _claim(self, batch: Sequence[Message]) -> None:
        """Claim ``batch`` in the run guard, the lanes' group leases confirmed first.

        A stall (a frozen host, a paused process) may have outlived the leases: renewed before
        anything polled after it runs, a lane another group took stops the member
        (:meth:`LaneLease.confirm`); otherwise no Redis call.
        """
        if self._lease is not None and batch:
            await self._lease.confirm()
        await self._guard.extend(batch)

    async def _lanes_held(self, stop: asyncio.Event) -> bool:
        """Hold the lanes' group leases, waiting while another group holds one; False at stop.

        Stopped while waiting, the member gives up what it held and closes what it opened.
        """
        if self._lease is None or await self._lease.wait(stop):
            return True
        await self._close_clients()
        return False

    async def _shutdown(
        self, committer: asyncio.Task[None], runners: Sequence[asyncio.Task[None]] = ()
    ) -> None:
        """Stop fetching, let in-flight work finish within the grace period, commit, leave.

        What still runs when the grace ends is cancelled before the partitions are given up, so
        their next owners never run it beside this member; a run that ignores its cancellation
        for :data:`_STOP_MARGIN_S` past ``cancel_grace_s`` is left behind (:attr:`abandoned`).
        """
        self._routing.stopping = True
        loop = asyncio.get_running_loop()
        self._deadline_s = loop.time() + self._settings.shutdown_grace_s
        consumer = self._consumer
        assert consumer is not None  # noqa: S101 - run() set it
        consumer.pause(sorted(self._offsets))
        polling = asyncio.create_task(self._keep_polling(consumer))
        late: set[asyncio.Task[None]] = set()
        if runners:  # running turns finish within the grace period; unfinished ones run again
            await self._within_grace(asyncio.wait(runners))
            late = {task for task in runners if not task.done()}
            for task in late:
                task.cancel()
        lanes = self._chain.lanes
        await self._within_grace(lanes.wait_idle())
        if self._hurry is not None and self._hurry.is_set():
            log.warning(
                "stopping now (a second signal): %d run(s) still going cancelled, not committed"
                " (delivered again to their partitions' next owners)",
                lanes.running + len(late),
            )
        # One deadline for every cancelled run to end: a stuck one is waited for once.
        stop_s = self._settings.cancel_grace_s + _STOP_MARGIN_S
        ends_s = loop.time() + stop_s
        left = await lanes.close(stop_s)  # what still runs is cancelled
        if late:
            await asyncio.wait(late, timeout=max(0.0, ends_s - loop.time()))
        stuck = [task for task in late if not task.done()]
        self.abandoned = len(left) + len(stuck)
        for work in left:
            log.warning(
                "%s@%d on lane %s did not stop when cancelled at shutdown; left running, not"
                " committed (delivered again)",
                work.message.tp,
                work.message.offset,
                work.lane.name,
            )
        if stuck:
            log.warning("%d debounced turn(s) did not stop when cancelled at shutdown", len(stuck))
        await cancel_until_done(committer, report=False)  # a failed one was logged already
        await self._last_commit(consumer)
        await cancel_until_done(polling, report=False)  # its polls go through redis-py too
        with contextlib.suppress(asyncio.CancelledError):
            polling.result()  # an error it ended with is raised, as when it was awaited
        await consumer.close()  # revokes what is left through on_revoked
        await self._end_background({work.message.tp for work in left}, ends_s)
        await self._guard.close()
        if self._chain.gate is not None:
            await self._chain.gate.close()
        await self._close_clients()

    async def _close_clients(self) -> None:
        """Close the handler stage and the producer, then give up the lanes' group leases.

        Out of the group (or never in it): its last member frees its lanes.
        """
        await self._handler.close()
        with contextlib.suppress(TransportError):
            await self._producer.close()
        if self._lease is not None:
            await self._lease.leave()

    async def _end_background(self, stuck: set[TopicPartition], ends_s: float) -> None:
        """Let revoked partitions whose runs ended give up their claims, then stop the rest.

        A task waiting for a run left behind (on a partition in ``stuck``) is stopped at once:
        that run keeps its claims, and shutdown waited for it until ``ends_s`` already. The
        others get until ``ends_s`` (event loop time), at least :data:`_GIVE_UP_FLOOR_S`.
        """
        waiting = {task for task, tps in self._background.items() if not tps & stuck}
        if waiting:
            loop = asyncio.get_running_loop()
            await asyncio.wait(waiting, timeout=max(ends_s - loop.time(), _GIVE_UP_FLOOR_S))
        for task in list(self._background):  # a run left behind keeps its claims
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _last_commit(self, consumer: Consumer) -> None:
        """Commit what finished before leaving; a failure leaves it to be delivered again.

        A failure that is not the broker's (the one that stopped the commit loop, say) is
        logged with its traceback, and the member still leaves its group.
        """
        try:
            await self._commit(consumer)
        except TransportError:
            pass
        except Exception:
            log.exception(
                "%s: the last commit failed; its messages are delivered again", self.group
            )

    async def _keep_polling(self, consumer: Consumer) -> None:
        """Poll while shutdown drains, so the group keeps the member and its partitions.

        Kafka drops a member that has not polled for ``max.poll.interval.ms``, and its
        partitions' next owners would run what still runs here. The partitions are paused: a
        message that comes back all the same (of a partition assigned meanwhile) is not
        started, so it is not committed and its partition's next owner reads it.

        A topic that does not exist ends it quietly, as it ends :meth:`run`'s polling: it is
        what stopped the member (``run`` raises it), not a failure to retry and log again.
        """
        while True:
            try:
                batch = await consumer.poll(self._settings.poll_max, 0.5)
            except UnknownTopic:
                return
            except TransportError as exc:
                log.warning("poll during shutdown failed, retrying in 0.5 s: %s", exc)
                await asyncio.sleep(0.5)
                continue
            if batch:
                consumer.pause(sorted({message.tp for message in batch}))

    async def _within_grace(self, waiting: Awaitable[object]) -> None:
        """Wait for ``waiting`` until the grace ends or is cut short (``hurry``)."""
        tasks: set[asyncio.Future[object]] = {asyncio.ensure_future(waiting)}
        if self._hurry is not None:
            tasks.add(asyncio.ensure_future(self._hurry.wait()))
        try:
            await asyncio.wait(
                tasks, timeout=self._grace_left_s(), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waited in tasks:
                waited.cancel()

    def _revoke_wait_s(self) -> float:
        """How long a revocation waits on running work: the grace left, within the group's budget.

        A Kafka member answers a rebalance inside its poll; waiting there longer than the
        group allows (``max.poll.interval.ms``) would get it dropped, losing every partition.
        """
        budget_s = getattr(self._consumer, "revoke_budget_s", None)
        if isinstance(budget_s, float):
            return min(self._grace_left_s(), budget_s)
        return self._grace_left_s()

    def _grace_left_s(self) -> float:
        """How long running work may still take: the whole grace, or what shutdown left of it."""
        if self._deadline_s is None:
            return self._settings.shutdown_grace_s
        return max(0.0, self._deadline_s - asyncio.get_running_loop().time())

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
        self._chain.enter(message, offsets)

    # -- settle: the end of the chain ------------------------------------------------------------

    def _settle(self, work: Work, outcome: str | None, duration_s: float) -> None:
        """Record what became of ``work``: its offset, its log row, its metrics."""
        message, lane = work.message, work.lane
        if outcome is not None:  # None: it could not be routed; leave it for redelivery
            offsets = work.offsets  # its assignment's: the partition may have come back since
            if offsets is not None:
                offsets.finished(message.offset)
        if self._flow is not None and work.offsets in (None, self._offsets.get(message.tp)):
            # A run of a revoked assignment, ending once the partition came back, was never
            # counted in the new assignment's buffer.
            self._flow.removed(message.tp, sent_away=work.sent_away)
        self._delivered(lane, message, outcome, duration_s)
        if log.isEnabledFor(logging.DEBUG):
            tenant = message.headers.get(h.TENANT)
            log.debug(
                "delivery",
                extra={
                    "topic": message.topic,
                    "partition": message.partition,
                    "offset": message.offset,
                    "key": printable(message.key),
                    "tenant": None if tenant is None else tenant.decode(errors="replace"),
                    "attempt": h.attempt(message.topic, message.headers),
                    "outcome": outcome,
                    "duration_s": duration_s,
                },
            )

    def _settled_follower(self, lane: Lane, message: Message, outcome: str | None) -> None:
        """A follower released from parking ran: its log row and metrics (no offset of ours)."""
        self._delivered(lane, message, outcome, 0.0)

    def _delivered(
        self, lane: Lane, message: Message, outcome: str | None, duration_s: float
    ) -> None:
        """Count a delivery; a settled one's log row is marked processed at the next commit."""
        if self._processed is not None and outcome in _SETTLED:
            self._rows_finished((message,))
        if self._metrics is not None:
            self._metrics.delivered(lane.name, outcome or "unrouted", duration_s)

    def _rows_finished(self, messages: Sequence[Message]) -> None:
        if self._processed is None:
            return
        self._finished_rows += _row_ids(messages)

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

    def _set_limit(self, limit: int) -> None:
        self._chain.lanes.limit = limit

    def _report(self) -> None:
        """Publish the gauges and the admissions since the last tick.

        Busy slots and who waits for admission per lane; admissions granted, and let through
        failing open, per lane.
        """
        if self._chain.batch.waiting:
            self._chain.batch.pump()  # promotion is by age: look again on every tick
        if self._metrics is not None:
            self._report_lanes(self._metrics)
        if self._admission_metrics is None or self._chain.gate is None:
            return
        granted, failed_open = self._chain.gate.take_counts()
        for lane, count in granted.items():
            self._admission_metrics.granted(lane, count)
        for lane, count in failed_open.items():
            self._admission_metrics.failed_open(lane, count)
        by_lane: dict[str, dict[str, int]] = {
            name: {} for name, lane in self.app.lanes.items() if lane.spec.throttle
        }
        for (lane, tenant), count in self._chain.gate.waiting_by.items():
            by_lane.setdefault(lane, {})[tenant] = count
        for lane, tenants in by_lane.items():
            self._admission_metrics.waiting(lane, sum(tenants.values()))
            self._admission_metrics.throttled_tenants(lane, tenants)

    def _report_lanes(self, metrics: RuntimeMetrics) -> None:
        """Busy slots, batch lanes, lanes of long work and finished messages still in the lag."""
        metrics.slots(*self._slots())
        for name, sla_s in self._batch_slas.items():
            metrics.batch_lane(name, sla_s, self._chain.batch.waiting_in(name))
        for name, timeout_s in self._heartbeat_timeouts.items():  # its age is a run's
            metrics.long_work_lane(name, timeout_s)
        for name, count in self._finished_ahead().items():  # in the lag, yet done
            metrics.finished_uncommitted(name, self.group, count)

    def _slots(self) -> tuple[int, int]:
        """Handler slots in use by interactive work, and all handler slots of this member.

        The message slots (``max_concurrency``, lowered under pressure), without those running
        batch work (it never asks to scale up), and each debounced lane's turn runner's
        (``max_concurrency`` turns of the lane). A debounced message takes a message slot only
        to be buffered, and its offset is committed then: the lane's load is its turns, which
        no lag or age shows. The message slots of a member of debounced lanes only run no
        handler and are left out.
        """
        lanes = self._chain.lanes
        left_out = [
            tp
            for tp in self._offsets
            if tp.topic in self._batch_topics or tp.topic in self._turn_topics
        ]
        busy = lanes.running - (lanes.running_on(left_out) if left_out else 0)
        total = lanes.limit if self._message_slots else 0
        if self._turns is not None:
            runners = self._turns.runners.values()
            busy += sum(runner.running for runner in runners)
            total += sum(runner.limit for runner in runners)
        return busy, total

    def _finished_ahead(self) -> dict[str, int]:
        """Per lane, messages of its main topics done above their partition's lowest not done."""
        ahead = dict.fromkeys(self._main_topics.values(), 0)
        for tp, offsets in self._offsets.items():
            if tp.topic in self._main_topics:
                ahead[self._main_topics[tp.topic]] += offsets.done_ahead
        return ahead

    async def _mark_processed(self) -> None:
        """Tell the log store which rows are finished (one batch per commit tick).

        The rows of the long work and of the debounced turns still running here are shown alive
        first (one batch too), so the ingress's sweeper does not replay a run that outlasts its
        patience.
        """
        if self._processed is None:
            return
        running = _row_ids(self._longwork.long_messages())
        if self._turns is not None:
            running += _row_ids(self._turns.running_messages())
        if running:
            try:
                await self._processed.mark_running(running)
            except PipelineError as exc:
                log.warning("could not show %d running log rows alive: %s", len(running), exc)
        if not self._finished_rows:
            return
        rows, self._finished_rows = self._finished_rows, []
        try:
            await self._processed.mark_processed(rows)
        except PipelineError as exc:
            log.warning("could not mark %d log rows processed: %s", len(rows), exc)
            self._finished_rows = rows + self._finished_rows

    async def _commit(self, consumer: Consumer) -> None:
        self._report()
        self._ticks += 1
        if self._ticks % self._reap_every == 0:
            await self._guard.tick(self.app.lanes)
            if self._lease is not None:
                await self._renew_lease(self._lease)
        # Ends first: a committed message must not look started to the next member.
        await self._guard.flush()
        # Positions first: every offset about to be committed has its log row in the batch
        # marked now, so a crash after the commit cannot leave a handled row unmarked.
        positions = self._positions(sorted(self._offsets))
        await self._mark_processed()
        if positions:
            await consumer.commit(positions)
            for position in positions:
                self._committed[position.tp] = position

    async def _renew_lease(self, lease: LaneLease) -> None:
        """Renew the lanes' group leases: a lane taken stops the member (:class:`LaneTaken`).

        Renewed through the shutdown's drain too, which may outlast a lease: the lanes stay
        this group's until the member leaves. Taken during the drain, the member stops anyway.
        """
        if self._deadline_s is None:
            await lease.renew()
            return
        with contextlib.suppress(LaneTaken):  # its CRITICAL line was logged
            await lease.renew()

    async def _give_up_when_idle(
        self, tps: set[TopicPartition], claimed: dict[str, list[TopicPartition]]
    ) -> None:
        """Give up the claims of revoked partitions once nothing of theirs runs here.

        A run of theirs still going (lost partitions, or past the revocation's wait) keeps its
        claim, so the partition's next owner waits for it instead of running its message beside
        it; for as long as it runs, or until this process's liveness runs out.
        """
        await self._chain.lanes.wait_idle(tps)
        await self._guard.give_up(claimed)

    def _superseded(self, _tps: list[TopicPartition]) -> None:
        """Another member process was assigned partitions still held here: ask the group again."""
        consumer = self._consumer
        if consumer is None or self._rejoining:
            return
        self._rejoining = True
        task = asyncio.create_task(self._rejoin(consumer))
        self._background[task] = set()
        task.add_done_callback(self._background.pop)

    async def _rejoin(self, consumer: Consumer) -> None:
        try:
            await consumer.rejoin()
        except TransportError as exc:
            log.warning("%s could not rejoin its group: %s", self.group, exc)
        finally:
            self._rejoining = False

    # -- rebalance listener ---------------------------------------------------------------------

    async def on_assigned(
        self, partitions: Sequence[TopicPartition], committed: Mapping[TopicPartition, Position]
    ) -> None:
        """Start tracking new partitions from the group's committed positions."""
        for tp in partitions:
            self._offsets[tp] = PartitionOffsets(tp, committed.get(tp))
            if tp in committed:
                self._committed[tp] = committed[tp]
        await self._guard.assigned(partitions, committed)
        log.info(
            "%s assigned %s", self.group, partitions_text(partitions) if partitions else "nothing"
        )

    async def on_revoked(
        self, partitions: Sequence[TopicPartition], *, lost: bool
    ) -> Sequence[Position]:
        """Drop queued work of leaving partitions, let running work finish, return positions."""
        tps = set(partitions)
        self._chain.drop(tps)
        if self._chain.due is not None:
            self._chain.due.drop(tps)
        self._chain.batch.drop(tps)
        if not lost:  # at shutdown, running work had its grace already
            # Not asyncio.wait_for: on Python 3.11 it drops a cancellation that lands as the
            # runs end (CPython issue 86296), and a Redis Streams poll that the shutdown had
            # cancelled went on polling for ever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._revoke_wait_s()):
                    await self._chain.lanes.wait_idle(tps)
        if not lost:
            await self._guard.flush()
        claimed = self._guard.revoked(tps)
        if lost or self._chain.lanes.running_on(tps):  # give up the claims once it all ended
            task = asyncio.create_task(self._give_up_when_idle(tps, claimed))
            self._background[task] = tps
            task.add_done_callback(self._background.pop)
        else:
            await self._guard.give_up(claimed)
        positions = [] if lost else self._positions(sorted(tps))
        for tp in tps:
            self._offsets.pop(tp, None)
            self._committed.pop(tp, None)
            if self._flow is not None:
                self._flow.forget(tp)
            if self._pauses is not None:
                self._pauses.forget(tp)
        log.info(
            "%s revoked %s%s", self.group, partitions_text(sorted(tps)), " (lost)" if lost else ""
        )
        return positions


def _row_ids(messages: Sequence[Message]) -> list[str]:
    """The ingress log rows (``pl-row-id``) of ``messages`` that have one."""
    ids: list[str] = []
    for message in messages:
        row = message.headers.get(h.ROW_ID)
        if row is not None and b"\x00" not in row:  # no log store keeps a NUL in an id
            with contextlib.suppress(UnicodeDecodeError):  # nor bytes that are not text
                ids.append(row.decode())
    return ids


def _check_heartbeats(lanes: Sequence[Lane], settings: RuntimeSettings) -> None:
    """Refuse a lane of long work whose heartbeat timeout the member's ticks cannot keep.

    A member sends its runs' heartbeats to Redis once a tick (``cancel_poll_ms``): with a
    timeout under two ticks, every member's reconciler could find a healthy run silent and stop
    it as hung.
    """
    tick_ms = settings.cancel_poll_ms
    for lane in lanes:
        timeout_ms = lane.spec.heartbeat_timeout_ms
        if timeout_ms is not None and timeout_ms < 2 * tick_ms:
            raise ConfigError(
                f"lane {lane.name}: heartbeat_timeout ({format_duration_ms(timeout_ms)}) must be"
                f" at least twice PIPELINE_RUNTIME__CANCEL_POLL_MS ({tick_ms} ms), the tick that"
                " sends heartbeats: raise the timeout or lower the tick"
            )


def _claims(
    stores: dict[str, GuardStore],
    lanes: Sequence[Lane],
    settings: RuntimeSettings,
    superseded: Callable[[list[TopicPartition]], None],
) -> dict[str, LaneClaims]:
    """Claimed ranges for the main topic of each guarded lane (``runtime/claims.py``)."""
    return {
        lane.name: LaneClaims(
            stores[lane.name],
            lane.spec.name,
            ordered=ordered_retries(lane),
            ahead=settings.partition_high_water,
            on_superseded=superseded,
        )
        for lane in lanes
        if lane.name in stores
    }
