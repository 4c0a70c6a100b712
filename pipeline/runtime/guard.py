"""The guard stage: per-key order across retries (parking) and poison detection around each run.

Before a message of a guarded lane runs, :class:`RunGuard` records its start
(:class:`~pipeline.runtime.starts.StartWindow` batches the starts of one loop turn into one
Redis call) and learns what to do with it: run it; hold it behind its key's parked head; drop a
stale or duplicate copy; dead-letter it behind a dead-lettered head; wait while another member
process that is still alive runs this very copy (it lost the partition to a stall, not a crash),
until that run ends or this member loses the partition in turn (then it does not run here); or,
when an earlier start of it never finished, run it alone as a suspect
(:mod:`pipeline.runtime.isolation`) unless its lone starts reached ``poison_after``. After the
run it records the end: batched with the next starts when nothing is parked, or when its route
to a retry tier parked its key (``gd_route``); otherwise (it belongs to a parked key, or is
dead-lettered on an ordered lane) in a ``gd_end_many`` shared with the other such ends of the
turn (:mod:`pipeline.runtime.ends`). When a head finishes, the guard
runs the followers released to it, in order. See :mod:`pipeline.retry.guard_store` for the
state and its guarantees.

A first delivery that parks its key (its failure or deferral routed through a tier) tells Redis
where it was read: a delivery of the key read again from that partition below it, after a crash
before the commit, is a copy of a message that finished here, and is dropped as stale rather
than run again behind the head. That holds because the key lanes run a key's messages one at a
time, in order, and every stage before them keeps a key's order (a deferral or a spill included):
when a message parks its key, every earlier message of the key this member read from the
partition has been through the guard. Those left unfinished (unrouted, or raised) are
remembered (:class:`_Unfinished`), and the lowest of them is where the key is parked from
instead, so that none of them is ever dropped. A message without a key or with the empty key
parks it from nowhere: the guard takes both for one key, which the key lanes run apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from redis import exceptions as rexc

from pipeline import headers as h
from pipeline import tracing
from pipeline.cancel_tasks import cancel_until_done
from pipeline.envelope import Message, Position, TopicPartition
from pipeline.errors import PoisonMessage, SequencedDeadLetter
from pipeline.retry.guard_store import (
    RELEASED_POSITION,
    Decision,
    Ending,
    GuardStore,
    KeyEnds,
    Release,
    Start,
    message_id,
    position,
    start_of,
)
from pipeline.retry.held import encode_held
from pipeline.retry.keys import encode_key
from pipeline.runtime.app import Lane
from pipeline.runtime.claims import LaneClaims
from pipeline.runtime.ends import EndWindow
from pipeline.runtime.isolation import Isolation
from pipeline.runtime.redirect import Redirector
from pipeline.runtime.starts import StartWindow
from pipeline.runtime.stats import Stats

log = logging.getLogger(__name__)
decisions = logging.getLogger("pipeline.guard.decisions")
"""One DEBUG line per guard decision (``PIPELINE_LOG_LEVEL=DEBUG``): which copy of which
message was run, held, dropped or made to wait, and why (see ``pipeline/retry/lua/guard.lua``)."""

_BUSY_FIRST_S = 0.05
_BUSY_MAX_S = 1.0
"""A copy that another live member process still runs asks again after these pauses (doubling)."""

# How a handler outcome ends a guarded message (anything else: done).
_ENDINGS: dict[str, Ending] = {"retried": "parked", "deferred": "parked", "dead_lettered": "dead"}

_SHARED: contextlib.AbstractAsyncContextManager[None] = contextlib.nullcontext()
"""No gate held around a run (see RunGuard._gate)."""


class _Run(NamedTuple):
    """How the guard decided a start that runs: its decision, start count, and key parked."""

    decision: Decision
    starts: int
    parked: bool


class _Unfinished:
    """Main-topic messages of ordered lanes whose run here left them unfinished, per key.

    Run unrouted (outcome None) or raised, their offsets are not done: they are read again
    after a crash or rebalance, and must run then. A later message of their key that parks it
    names the lowest of them as where the key is parked from, so that they are not taken for
    copies of finished messages (:meth:`RunGuard._routed`). An entry goes once a delivery of
    that offset finishes here, or once the partition comes back committed past it; a partition
    that never comes back keeps its entries (one a message left unrouted, rare: a broker or
    payload store out of reach past the router's retries).
    """

    __slots__ = ("_offsets",)

    def __init__(self) -> None:
        """None yet."""
        self._offsets: dict[tuple[TopicPartition, bytes | None], set[int]] = {}

    def __bool__(self) -> bool:
        return bool(self._offsets)

    def left(self, message: Message) -> None:
        """``message``'s run here ended without finishing it."""
        self._offsets.setdefault((message.tp, message.key), set()).add(message.offset)

    def finished(self, message: Message) -> None:
        """A delivery of ``message``'s offset finished here."""
        key = (message.tp, message.key)
        offsets = self._offsets.get(key)
        if offsets is not None:
            offsets.discard(message.offset)
            if not offsets:
                del self._offsets[key]

    def committed(self, positions: Mapping[TopicPartition, Position]) -> None:
        """The partitions came here committed at ``positions``: what is below them finished."""
        for key in [key for key in self._offsets if key[0] in positions]:
            floor = positions[key[0]].offset
            offsets = {offset for offset in self._offsets[key] if offset >= floor}
            if offsets:
                self._offsets[key] = offsets
            else:
                del self._offsets[key]

    def lowest(self, message: Message) -> int:
        """The lowest offset of ``message``'s key on its partition not finished here.

        Its own, or that of an earlier message of the key left unfinished.
        """
        left = self._offsets.get((message.tp, message.key), set())
        return min(left | {message.offset})


_UNRECORDED_KEPT = 10_000
"""Ends on parked keys kept to be sent again while Redis cannot be reached (P4: bounded)."""
_UNRECORDED_SENT = 256
"""Ends on parked keys sent again in one call at most (the rest at the next ticks)."""


class _Unrecorded:
    """Ends that leave a parked key (``done``, ``dead``) which Redis did not answer, per lane.

    Such an end is what releases the key's held followers, whose offsets are committed: lost,
    they would wait until their key's state expires and then be gone without a word, since
    the message that ended (its offset committed too) never comes back to end again. Each is
    sent again at the member's next tick (:meth:`RunGuard.tick`) until Redis answers. One that
    did reach Redis (its reply lost) is found gone there and changes nothing.
    """

    __slots__ = ("_ends", "dropped", "failing", "recorded")

    def __init__(self) -> None:
        """None yet."""
        self._ends: dict[str, list[KeyEnds]] = {}
        self.dropped: dict[str, int] = {}
        """Ends dropped past the bound since Redis last recorded the lane's kept ends."""
        self.failing: set[str] = set()
        """Lanes whose kept ends Redis refused since it last recorded them (logged once)."""
        self.recorded: dict[str, int] = {}
        """Ends recorded again since the lane last had none kept (logged once all are)."""

    def keep(self, lane: str, ends: KeyEnds) -> None:
        """``ends`` got no answer: send them again later (the oldest dropped past the bound)."""
        kept = self._ends.setdefault(lane, [])
        kept.append(ends)
        if len(kept) > _UNRECORDED_KEPT:
            self._drop(lane, kept.pop(0))

    def take(self, lane: str) -> list[KeyEnds]:
        """The oldest ends of ``lane`` waiting to be sent again (one call's), now the caller's."""
        kept = self._ends.pop(lane, [])
        if len(kept) > _UNRECORDED_SENT:
            self._ends[lane] = kept[_UNRECORDED_SENT:]
        return kept[:_UNRECORDED_SENT]

    def put_back(self, lane: str, ends: list[KeyEnds]) -> None:
        """``ends`` (from :meth:`take`) got no answer again: before those kept since, bounded."""
        kept = ends + self._ends.get(lane, [])
        self._ends[lane] = kept[:_UNRECORDED_KEPT]
        for dropped in kept[_UNRECORDED_KEPT:]:
            self._drop(lane, dropped)

    def _drop(self, lane: str, dropped: KeyEnds) -> None:
        """``dropped`` is not kept (past the bound): said once until Redis records again."""
        count = self.dropped.get(lane, 0)
        self.dropped[lane] = count + 1
        if count:
            return
        log.error(
            "lane %s: more than %d ends on parked keys wait for Redis; the oldest are dropped"
            " from now on (first %s; the count is logged once Redis answers): the followers"
            " held behind those messages are not released, and wait in Redis until their"
            " key's state expires",
            lane,
            _UNRECORDED_KEPT,
            dropped.ends[0][0].ident,
        )

    def lanes(self) -> list[str]:
        """The lanes with ends kept."""
        return list(self._ends)

    def count(self, lane: str) -> int:
        """How many ends of ``lane`` are kept."""
        return len(self._ends.get(lane, ()))


Call = Callable[[Lane, Message], Awaitable[str | None]]
"""The next stage: run the handler on a message and route its failure; its outcome."""
Settled = Callable[[Lane, Message, str | None], None]
"""Told of every released follower's outcome (its offset is not the member's to finish)."""


class RunGuard:
    """Parking and poison detection around the runs of one member."""

    def __init__(
        self,
        stores: dict[str, GuardStore],
        routing: Redirector,
        stats: Stats,
        isolation: Isolation,
        call: Call,
        settled: Settled,
        claims: dict[str, LaneClaims] | None = None,
        checkpoint_s: float = 0.5,
        group: str = "",
    ) -> None:
        """Guard the lanes that have a store (Redis); others go straight to ``call``.

        Lanes in ``claims`` run first deliveries under claimed ranges (``runtime/claims.py``).
        ``checkpoint_s``: the ends of released followers that ran are recorded at least this
        often (the member's commit interval), however long their release is. ``group``: the
        consumer group, named on a released follower's ``process`` span.
        """
        self._group = group
        self._checkpoint_s = checkpoint_s
        self._stores = stores
        self._claims = claims or {}
        self._windows = {lane: StartWindow(store) for lane, store in stores.items()}
        self._ends = {lane: EndWindow(store) for lane, store in stores.items()}
        self._routing = routing
        self._stats = stats
        self._isolation = isolation
        self._call = call
        self._settled = settled
        self._releasing: dict[str, set[str]] = {lane: set() for lane in stores}
        self._draining: set[str] = set()
        """Lanes that no longer park but whose Redis had parked keys when last asked: a retry
        copy of theirs asks whether it is its parked key's head (:meth:`tick`)."""
        self._drain_known: set[str] = set()
        """Lanes whose parked keys were counted once (their first retry copy, or a reap)."""
        self._running: dict[str, Start | Message] = {}
        """Starts running in this member, by message id, until they end or are routed (a first
        delivery under a claim: the message, its start built only if it is routed)."""
        self._route_recorded: set[str] = set()
        """Runs whose route to a retry tier was recorded (``gd_route``): on an ordered lane it
        parked their key, so their end needs no ``gd_end_many``. Their end, once the copy is
        produced, leaves their start mark to that copy (a redelivery of theirs is then stale)."""
        routing.on_route = self._routed
        self._reaped: set[asyncio.Task[None]] = set()
        self._assignments: dict[TopicPartition, int] = {}
        """Partitions assigned here, each with the number of its assignment."""
        self._assigned = itertools.count(1)
        self._telling = decisions.isEnabledFor(logging.DEBUG)
        """Whether each decision is logged (read once: the hot path pays one attribute)."""
        self._stale_told: set[str] = set()
        """Lanes that logged a copy dropped as stale (:meth:`_dropped_stale`)."""
        self._unfinished = _Unfinished()
        """Main-topic messages of ordered lanes left unfinished here (:meth:`_routed`)."""
        self._unrecorded = _Unrecorded()
        """Ends on parked keys that Redis did not answer, sent again at each tick."""

    @property
    def calls(self) -> int:
        """Batched start calls made so far (with the ordinary ends they carried)."""
        return sum(window.calls for window in self._windows.values())

    @property
    def end_calls(self) -> int:
        """Batched calls made so far for ends on parked keys (``gd_end_many``)."""
        return sum(window.calls for window in self._ends.values())

    async def run(self, lane: Lane, message: Message) -> str | None:
        """Decide, run the next stage if it may, record the end; returns the outcome.

        A run that leaves its message unfinished (unrouted, or raising) is remembered on an
        ordered lane (:class:`_Unfinished`).
        """
        try:
            outcome = await self._run(lane, message)
        except BaseException:
            self._left(lane, message)
            raise
        if outcome is None:
            self._left(lane, message)
        elif self._unfinished:
            self._unfinished.finished(message)
        return outcome

    def _left(self, lane: Lane, message: Message) -> None:
        """``message``'s run ended unfinished: remembered if its key parks on this lane."""
        if lane.name in self._stores and ordered_retries(lane) and not h.retry_tier(message.topic):
            self._unfinished.left(message)

    async def _run(self, lane: Lane, message: Message) -> str | None:
        """:meth:`run` but for what it remembers.

        Most messages are first deliveries under this member's claim, with no suspect due: they
        run on :meth:`_run_unmarked`, in this call's own step, with nothing else to decide.
        """
        claims = self._claims.get(lane.name)
        if claims is None:
            if lane.name not in self._stores:  # not guarded
                return await self._call(lane, message)
        elif not self._telling:
            ident = claims.unmarked(message)  # None also when this process may have stalled
            if (
                ident is not None
                and ident not in self._running
                and self._isolation.try_enter_shared()
            ):
                return await self._run_unmarked(lane, message, ident)
        return await self._decide(lane, message)

    async def _decide(self, lane: Lane, message: Message) -> str | None:
        """Every start but the common one of :meth:`run`: confirm, mark, hold, wait or drop."""
        store = self._stores[lane.name]
        claims = self._claims.get(lane.name)
        if claims is not None:
            if claims.stalled():  # perhaps taken for dead: is the partition still this one's?
                await claims.confirm()
            ident = claims.unmarked(message)  # claimed and never started elsewhere
            if ident is not None and ident not in self._running:
                return await self._run_claimed(lane, message, ident)
        ordered = ordered_retries(lane)
        start = start_of(message, ordered=ordered)
        if not ordered and start.ident != start.position and await self._drains(lane):
            start.drains = True  # perhaps a head parked before the lane stopped parking
        if start.ident in self._running:  # another copy runs in this member right now
            self._stats.duplicates += 1
            return "duplicate"
        window = self._windows[lane.name]
        if ordered and claims is not None and claims.seen_parked(start.key):
            start.body = encode_held(message)  # held in the batched call if it is parked
        if claims is not None and await self._held_back(claims, message, start):
            return None  # not routed either: the partition's owner runs it
        decision, starts = await window.begin(start)
        decision = _answered(claims, start, decision, starts, ordered=ordered)
        if decision == "process":  # the common case, without the general path's layers
            return await self._process(lane, store, window, message, start, ordered)
        return await self._general(lane, store, message, start, decision, starts)

    async def _drains(self, lane: Lane) -> bool:
        """Whether ``lane`` (which does not park) still has keys it parked before.

        Counted (one ``HLEN``) at its first retry copy, which may come before the first reap
        tick; the reap keeps it up to date after that.
        """
        if lane.name not in self._drain_known:
            self._drain_known.add(lane.name)
            try:
                if await self._stores[lane.name].parked_count():
                    self._draining.add(lane.name)
            except (rexc.RedisError, OSError) as exc:
                log.warning("parking unavailable, could not count parked keys: %s", exc)
        return lane.name in self._draining

    async def _held_back(self, claims: LaneClaims, message: Message, start: Start) -> bool:
        """Whether ``message`` must not run here: it would run beside its partition's owner.

        That is so when another process was assigned the partition since it came here, or when
        it lies in a range a previous owner claimed and, while it waited for that one, the
        partition was revoked here (and this member's claim given up) or taken over.
        """
        if claims.superseded(message.tp):
            return True
        if not claims.inherited(message):
            return False
        assignment = self._assignments.get(message.tp)
        start.inherited = await claims.wait_for_holders(message.tp)
        return self._assignments.get(message.tp) != assignment or claims.superseded(message.tp)

    async def _general(
        self,
        lane: Lane,
        store: GuardStore,
        message: Message,
        start: Start,
        decision: Decision,
        starts: int,
    ) -> str | None:
        """Every decision but an immediate ``process``: wait, ask the key, hold, drop, run."""
        if self._telling:
            _tell(lane, start, f"{decision}, {starts} starts")
        run = await self._final(lane, message, start, decision, starts)
        if run is None:
            return None  # revoked while it waited: the partition's next owner runs it
        if run.decision == "stale":
            self._dropped_stale(lane, store, start)
        skipped = self._not_run(run.decision)
        if skipped is not None:
            return skipped
        async with self._gate(run.decision):
            outcome, released = await self._ran(lane, message, start, run)
        if released:
            await self._release(lane, store, released)
        return outcome

    async def _final(
        self, lane: Lane, message: Message, start: Start, decision: Decision, starts: int
    ) -> _Run | None:
        """The decision to carry out: after waiting out ``busy``, and asking a parked key.

        None if the partition was revoked while it waited.
        """
        store, window = self._stores[lane.name], self._windows[lane.name]
        pause_s = _BUSY_FIRST_S
        assignment = self._assignments.get(message.tp)
        while True:
            if decision == "busy":  # another live member process still runs this very copy
                self._stats.busy_waits += 1
                await asyncio.sleep(pause_s)
                if self._assignments.get(message.tp) != assignment:
                    return None
                pause_s = min(pause_s * 2, _BUSY_MAX_S)
                decision, starts = await window.begin(start)
                continue
            parked = decision in ("slow", "head")  # its key is parked: its end: gd_end_many
            if decision == "slow":
                decision, starts = await store.begin_parked(message, start)
                if self._telling:
                    _tell(lane, start, f"its parked key says {decision}, {starts} starts")
                if decision == "busy":
                    continue
            elif decision == "head":  # marked already, as gd_key_begin's process would have
                decision = "process"
            return _Run(decision, starts, parked)

    async def _ran(
        self, lane: Lane, message: Message, start: Start, run: _Run
    ) -> tuple[str | None, list[Release]]:
        """Run a decided start and record its end; its outcome and the followers it released.

        A suspect's end is in Redis when this returns (see :meth:`_gate`).
        """
        store, window = self._stores[lane.name], self._windows[lane.name]
        decision, parked = run.decision, run.parked
        outcome, ending, routed = await self._decided(
            lane, store, message, start, decision, run.starts
        )
        if parked and start.drains and _ENDINGS.get(outcome or "") == "parked":
            # A head of a lane that stopped parking, retried again: it stays its key's head
            # (its mark kept for its next copy), its followers held until that copy ends.
            ending = "parked"
        # Ended as usual, in the next batched call; a run left unrouted ends its mark too, as
        # in _process, so that the mark does not hold its next delivery back.
        usual = outcome is not None and (ending == "done" or (ending and not start.ordered))
        unrouted = outcome is None and decision in ("process", "suspect")
        if not parked and (usual or unrouted):
            window.ended(start, routed=routed and outcome is not None)
            if decision == "suspect":
                await window.flush()
            return outcome, []
        if outcome is None or ending is None:  # not routed (delivered again), or not ours
            return outcome, []
        return outcome, await self._recorded(lane, start, ending, routed=routed)

    async def _run_claimed(self, lane: Lane, message: Message, ident: str) -> str | None:
        """Run a first delivery under this member's claim: no start mark, no Redis call.

        The steps of :meth:`_process` without a window; a usual end is implied by the commit
        and sends nothing. The start is built only for an end that needs one: a route (its
        mark, written by ``_routed``, is left to the retry copy, or ended if that copy was not
        produced) or a dead letter on an ordered lane.
        """
        if self._telling:
            key = encode_key(message.key)
            decisions.debug("%s: %s claimed here (key %s): runs unmarked", lane.name, ident, key)
        claims = self._claims[lane.name]
        outcome = await self._shared(lane, message, ident, message, claims=claims)
        return await self._unmarked_end(lane, message, ident, outcome)

    async def _run_unmarked(self, lane: Lane, message: Message, ident: str) -> str | None:
        """:meth:`_run_claimed` for a start already let in (``try_enter_shared``), not waited.

        Nothing was awaited since :meth:`LaneClaims.unmarked` found this process live, so the
        check :meth:`_shared` makes after a wait at the gate is not needed; a handled run ends
        here, its end implied by the commit.
        """
        running = self._running
        running[ident] = message
        try:
            outcome = await self._call(lane, message)
        finally:
            self._isolation.leave_shared()
            if running.get(ident) is message:
                del running[ident]
        if outcome == "handled" and ident not in self._route_recorded:
            return outcome
        return await self._unmarked_end(lane, message, ident, outcome)

    async def _unmarked_end(
        self, lane: Lane, message: Message, ident: str, outcome: str | None
    ) -> str | None:
        """After an unmarked run: end the mark its route wrote, or the key it parked."""
        ordered = ordered_retries(lane)
        if self._took_route(ident):
            # Its route wrote a mark (and parked the key on an ordered lane): a routed run ends
            # retried or deferred, its mark left to the retry copy; or, the copy not produced,
            # unrouted, its mark ended so that it does not hold the next delivery back.
            start = start_of(message, ordered=ordered)
            self._windows[lane.name].ended(start, routed=outcome is not None)
            return outcome
        if outcome is None:  # not routed: delivered again (no mark to end)
            return None
        ending = _ending(lane, outcome)
        if ending == "done" or not ordered:  # as in _process
            return outcome
        store = self._stores[lane.name]
        return await self._end(lane, store, start_of(message, ordered=True), ending, outcome)

    async def _shared(
        self,
        lane: Lane,
        message: Message,
        ident: str,
        running: Start | Message,
        *,
        claims: LaneClaims | None = None,
    ) -> str | None:
        """Call the next stage on ``message`` as an ordinary run, known as running meanwhile.

        A run that had to wait at the member's gate (a suspect ran alone) does not run, and is
        left for redelivery, when its partition was revoked meanwhile (:meth:`_entered`).
        """
        self._running[ident] = running
        isolation = self._isolation
        try:
            if not isolation.try_enter_shared() and not await self._entered(message, claims):
                return None
            try:
                return await self._call(lane, message)
            finally:
                isolation.leave_shared()
        finally:
            if self._running.get(ident) is running:
                del self._running[ident]

    async def _entered(self, message: Message, claims: LaneClaims | None) -> bool:
        """Wait at the gate for an ordinary run; False (and not entered) if it must not run.

        That is when its partition left this member while it waited: a revocation whose grace
        ran out with it waiting, or another process assigned the partition. The next owner
        runs it: a revocation gives this process's claim up once its grace is over, so a first
        delivery run unmarked here would not even be waited for, and would run beside that
        owner's run of it or of its key's next messages. With ``claims``, also when this
        process stalled past its liveness meanwhile and its partition was taken over: nothing
        in Redis would stop it beside the partition's new owner.
        """
        isolation = self._isolation
        assignment = self._assignments.get(message.tp)
        await isolation.enter_shared()
        try:
            if claims is not None and claims.stalled():
                await claims.confirm()
            if self._assignments.get(message.tp) == assignment and not (
                claims is not None and claims.superseded(message.tp)
            ):
                return True
        except BaseException:
            isolation.leave_shared()
            raise
        isolation.leave_shared()
        return False

    async def _process(
        self,
        lane: Lane,
        store: GuardStore,
        window: StartWindow,
        message: Message,
        start: Start,
        ordered: bool,
    ) -> str | None:
        """Run a message the guard let through at once (``process``): what most messages are.

        The same steps as :meth:`_decided` and :meth:`_carry_out` for that decision, inline.
        """
        if self._telling:
            _tell(lane, start, "process")
        outcome = await self._shared(lane, message, start.ident, start)
        routed = self._took_route(start.ident)
        if outcome is None:  # not routed: delivered again, and its run here is over
            window.ended(start)  # else a live member's mark would hold that delivery back
            return None
        ending = _ending(lane, outcome)
        if ending == "done" or not ordered or (ending == "parked" and routed):
            window.ended(start, routed=routed)  # routed: gd_route parked its key already
            return outcome
        return await self._end(lane, store, start, ending, outcome)

    def _took_route(self, ident: str) -> bool:
        """Whether the run of ``ident`` that just ended recorded its route in ``gd_route``."""
        if ident in self._route_recorded:
            self._route_recorded.remove(ident)
            return True
        return False

    async def _end(
        self, lane: Lane, store: GuardStore, start: Start, ending: Ending, outcome: str
    ) -> str:
        """Record an end that parks or leaves a parked key, and run the followers it releases."""
        released = await self._recorded(lane, start, ending)
        if released:
            await self._release(lane, store, released)
        return outcome

    async def _recorded(
        self, lane: Lane, start: Start, ending: Ending, *, routed: bool = False
    ) -> list[Release]:
        """Record an end that parks or leaves a parked key; the followers it releases.

        ``routed``: its route was recorded (``gd_route``) and its retry copy produced. An end
        Redis did not answer still ends the start's mark, as an ordinary end kept for the lane's
        next batched call (:meth:`StartWindow.ended`): left standing, a mark that names this
        run and no retry copy (its route refused too) would have that copy, once Redis answers
        again, dropped as a duplicate of a run still going, its offset committed. Sent again
        after the end did reach Redis, it finds the mark ended or taken over and changes nothing.
        """
        parks = ending == "parked"
        with self._parking(lane, start.key, parks=parks):
            released = await self._ends[lane.name].end(KeyEnds([(start, ending)], _follow(lane)))
        if released is None:
            self._windows[lane.name].ended(start, routed=routed)
            if ending in ("done", "dead"):  # it alone releases the key's held followers
                self._unrecorded.keep(lane.name, KeyEnds([(start, ending)], _follow(lane)))
        return self._released(lane, start, ending, released)

    def _released(
        self, lane: Lane, start: Start, ending: Ending, released: list[Release] | None
    ) -> list[Release]:
        """The followers an end call released; none if it got no answer (``released`` None).

        Not recorded, as far as this member knows: an end that parks the key may still reach
        Redis later, so the key stays known as maybe parked (:meth:`_unsure`).
        """
        if released is None:
            if ending == "parked":
                self._unsure(lane, start.key)
            return []
        return released

    def _parking(
        self, lane: Lane, key: str, *, parks: bool
    ) -> contextlib.AbstractContextManager[None]:
        """Around a call that parks ``key`` in Redis (``parks``): its lane's claims know of it."""
        claims = self._claims.get(lane.name)
        if claims is None or not parks:
            return contextlib.nullcontext()
        return claims.parking(key)

    def _unsure(self, lane: Lane, key: str) -> None:
        """A call that parks ``key`` got no answer: Redis may still run it (its lane's claims)."""
        claims = self._claims.get(lane.name)
        if claims is not None:
            claims.unsure(key)

    def _gate(self, decision: str) -> contextlib.AbstractAsyncContextManager[None]:
        """What a run decided as ``decision`` holds until its end is recorded.

        A suspect holds the member alone (:meth:`Isolation.alone`), so that no other run starts
        before its end is in Redis: a crash then could not leave its mark standing and count
        against it. Any other run enters the shared side itself, in :meth:`_decided`.
        """
        return self._isolation.alone() if decision == "suspect" else _SHARED

    def _dropped_stale(self, lane: Lane, store: GuardStore, start: Start) -> None:
        """``start`` is dropped as stale, its id finished: say so once per lane (WARNING).

        Its id is where its message was first delivered (``topic:partition:offset``); it
        finished, or it was read below where its parked key was parked from. A late duplicate
        after a crash is dropped so, as it must be; so is a new message at a position given out
        again (its topic deleted and created anew, or the lane run on the other transport, under
        the same key prefix, while the lane's guard state stayed in Redis).
        """
        if lane.name in self._stale_told:
            return
        self._stale_told.add(lane.name)
        log.warning(
            "lane %s: dropped %s read at %s without running it: that id finished before (%s),"
            " or its key is parked from a later offset of that partition, whose earlier messages"
            " had finished, so it is taken for a late duplicate, as after a crash; if it is a"
            " new message (its topic deleted and created again, or the lane moved to the other"
            " transport, under the same PIPELINE_REDIS__KEY_PREFIX) it was not run: delete the"
            " lane's guard keys (%s*) while no member of the lane runs, then produce it again"
            " (logged once per lane and process)",
            lane.name,
            start.ident,
            start.position,
            store.keys.gone,
            store.keys.tag,
        )

    def _not_run(self, decision: str) -> str | None:
        """The outcome of a start that does not run here (a copy, or held), else None."""
        if decision in ("stale", "copy"):
            self._stats.duplicates += 1
            return "duplicate"
        if decision == "held":
            self._stats.parked += 1
            return "parked"
        return None

    async def _decided(
        self,
        lane: Lane,
        store: GuardStore,
        message: Message,
        start: Start,
        decision: str,
        starts: int,
    ) -> tuple[str | None, Ending | None, bool]:
        """Carry out a decision to run, run alone or sequence ``message``, as a running start.

        ``start`` counts as running in this member until it ends or is routed (``_routed``).
        Returns its outcome, its end, and whether its route was recorded (``gd_route``).
        """
        self._running[start.ident] = start
        try:
            outcome, ending = await self._carry_out(lane, store, message, start, decision, starts)
            return outcome, ending, self._took_route(start.ident)
        finally:
            if self._running.get(start.ident) is start:
                del self._running[start.ident]
            self._route_recorded.discard(start.ident)

    async def _carry_out(
        self,
        lane: Lane,
        store: GuardStore,
        message: Message,
        start: Start,
        decision: str,
        starts: int,
    ) -> tuple[str | None, Ending | None]:
        if decision == "sequenced":
            log.warning(
                "dead-lettering %s[%d]@%d: sequenced",
                message.topic,
                message.partition,
                message.offset,
            )
            error = SequencedDeadLetter("it follows a dead-lettered message of its key")
            return await self._routing.dead_letter(lane, message, "sequenced", error), "dead"
        if decision == "suspect":
            return await self._suspect(lane, store, message, start, starts)
        await self._isolation.enter_shared()
        try:
            outcome = await self._call(lane, message)
        finally:
            self._isolation.leave_shared()
        return outcome, _ending(lane, outcome)

    async def _suspect(
        self, lane: Lane, store: GuardStore, message: Message, start: Start, starts: int
    ) -> tuple[str | None, Ending | None]:
        """Run a message whose earlier start never finished, or dead-letter it as poison.

        The caller holds the member's gate (:meth:`Isolation.alone`) until the end is recorded.
        """
        verdict, alone = await store.solo(start, poison_after=lane.spec.retry.poison_after)
        if self._telling:
            _tell(lane, start, f"{verdict} as a suspect, {alone} lone starts")
        if verdict == "stale":  # another copy finished it or took it over meanwhile
            self._stats.duplicates += 1
            return "duplicate", None  # the start mark is the other copy's: left alone
        if verdict == "poison":  # this start does not run: those before it were interrupted
            # The first interruption and alone - 1 lone ones at least (a released suspect's
            # start count is not known here: 0).
            interrupted, lone = max(starts - 1, alone), alone - 1
            log.warning(
                "dead-lettering %s[%d]@%d: poison (interrupted %d times, %d of them alone)",
                message.topic,
                message.partition,
                message.offset,
                interrupted,
                lone,
            )
            error = PoisonMessage(
                f"its processing was interrupted {interrupted} times ({lone} of them alone)"
            )
            return await self._routing.dead_letter(lane, message, "poison", error), "dead"
        outcome = await self._call(lane, message)
        return outcome, _ending(lane, outcome)

    async def _release(self, lane: Lane, store: GuardStore, first: list[Release]) -> None:
        """Run the followers released to this member, in order, until the key needs none."""
        releasing, key = self._releasing[lane.name], first[0].key
        releasing.add(key)
        released = first
        try:
            while released:
                released = await self._run_released(lane, store, released)
        finally:
            releasing.discard(key)

    async def _run_released(
        self, lane: Lane, store: GuardStore, released: list[Release]
    ) -> list[Release]:
        """Run one release's followers in order; record their ends in one call; the next ones.

        The release stops at a follower that does not end as ``done`` (it failed and parks the
        key again, or was dead-lettered): those after it did not run and wait where they were
        (``back``). It also stops after ``checkpoint_s``, so that a crash reruns little. A
        follower left unrouted keeps its start mark: the release's lease lapses and a reaper
        takes it over from that follower.
        """
        ends: list[tuple[Start, Ending]] = []
        window = self._ends[lane.name]
        follow = _follow(lane)
        checkpoint = asyncio.get_running_loop().time() + self._checkpoint_s
        for i, release in enumerate(released):
            start = _released_start(release)
            message = release.message
            if self._telling:
                _tell(lane, start, f"released: {release.decision}")
            async with self._gate(release.decision):  # a suspect is released alone
                delivery = tracing.process(message, lane.name, self._group)  # its own trace
                with tracing.guard(delivery):
                    outcome, ending, _ = await self._decided(  # ends go to gd_end_many
                        lane, store, message, start, release.decision, 0
                    )
                tracing.finish(delivery, outcome)
                self._settled(lane, message, outcome)
                if outcome is None or ending is None:  # its mark stays for the reaper
                    back = _given_back(released[i + 1 :])
                    if ends or back:
                        await window.end(KeyEnds([*ends, *back], follow, release=False))
                    return []
                last = i == len(released) - 1
                if ending != "done" or last or asyncio.get_running_loop().time() >= checkpoint:
                    back = _given_back(released[i + 1 :])
                    following = await window.end(KeyEnds([*ends, *back, (start, ending)], follow))
                    return self._released(lane, start, ending, following)
            ends.append((start, ending))
        return []

    async def _routed(self, lane: Lane, message: Message, attempt: int) -> None:
        """``message`` is about to go to a retry tier as ``attempt``: park its key first.

        Its copy may then run (here or in another member) even before this start has ended.
        """
        store = self._stores.get(lane.name)
        running = self._running.pop(message_id(message), None)
        if store is None or running is None:
            return
        ordered = ordered_retries(lane)
        start = running if isinstance(running, Start) else start_of(running, ordered=ordered)
        if ordered:
            start.below = self._parked_from(start, message)
        with self._parking(lane, start.key, parks=ordered):
            recorded = await store.route(start, attempt, park=ordered)
        if recorded:
            self._route_recorded.add(start.ident)
        elif ordered:
            self._unsure(lane, start.key)

    def _parked_from(self, start: Start, message: Message) -> str | None:
        """Where ``start``, about to park its key, parks it from (:attr:`Start.below`).

        Only a delivery read from a main topic (not a tier's copy, not a released follower):
        the lowest offset of its key on its partition that this member has not finished. The
        key lanes run a key's messages in order, one at a time, so every earlier one has been
        through the guard; those it left unfinished are remembered (:class:`_Unfinished`).

        Not for the empty key: the guard parks a message without a key and one with the empty
        key as one key (``encode_key``), which the key lanes and the throttle gate run apart,
        side by side. An earlier message of the other kind may still wait there, unrun, and
        would be dropped as stale when it comes: such a key is held behind its head as before.
        """
        if not message.key or start.position != position(message) or h.retry_tier(message.topic):
            return None
        return f"{message.topic}:{message.partition}:{self._unfinished.lowest(message)}"

    # -- claims -------------------------------------------------------------------------------

    async def assigned(
        self, tps: Sequence[TopicPartition], committed: Mapping[TopicPartition, Position]
    ) -> None:
        """Partitions came to this member: read and make the claims on them."""
        for tp in tps:
            self._assignments[tp] = next(self._assigned)
        if self._unfinished:
            self._unfinished.committed({tp: committed[tp] for tp in tps if tp in committed})
        for claims in self._claims.values():
            await claims.assigned(tps, committed)

    async def extend(self, batch: Sequence[Message]) -> None:
        """Claim what this poll batch holds before any of it runs."""
        if not self._claims or not batch:
            return
        tops: dict[tuple[str, int], int] = {}
        for message in batch:  # a partition's messages come in offset order
            tops[message.topic, message.partition] = message.offset
        for claims in self._claims.values():
            await claims.extend(tops)

    def revoked(self, tps: Iterable[TopicPartition]) -> dict[str, list[TopicPartition]]:
        """Partitions left this member: the claims to give up, by lane, once their work ended.

        A copy waiting for another member's run of it (``busy``) stops waiting and does not run.
        """
        tps = list(tps)
        for tp in tps:
            self._assignments.pop(tp, None)
        return {name: claims.revoked(tps) for name, claims in self._claims.items()}

    async def give_up(self, claimed: Mapping[str, Sequence[TopicPartition]]) -> None:
        """Delete claims returned by :meth:`revoked` (no work of theirs runs here any more)."""
        for name, tps in claimed.items():
            claims = self._claims.get(name)
            if claims is not None and tps:
                await claims.give_up(tps)

    async def flush(self) -> None:
        """Send the ends not sent yet (before a commit)."""
        for window in self._windows.values():
            await window.flush()

    async def tick(self, lanes: dict[str, Lane]) -> None:
        """Renew this member's liveness, claims and release leases; take over dead releases.

        A lane that no longer parks (made unordered, or left without retry tiers) drains the
        keys it parked before: their followers are released here (see ``gd_reap``), and while
        any is parked its retry copies ask whether they are a parked key's head.
        """
        for name, store in self._stores.items():
            await store.live()
            await store.renew(sorted(self._releasing[name]))
            claims = self._claims.get(name)
            if claims is not None:
                await claims.keep()
                await claims.forget_unparked()
            lane = lanes.get(name)
            if lane is None:
                continue
            await self._record_again(lane, store)
            drain_ms = None if ordered_retries(lane) else _drain_grace_ms(lane, store)
            released = await store.reap(drain_ms=drain_ms)
            self._drain_known.add(name)
            if drain_ms is not None and store.parked:
                self._draining.add(name)
            else:
                self._draining.discard(name)
            for release in released:
                if drain_ms is None:
                    log.warning("taking over the release of %s on lane %s", release.ident, name)
                else:
                    log.warning(
                        "releasing %s on lane %s, parked before the lane stopped parking (or"
                        " its release taken over)",
                        release.ident,
                        name,
                    )
                self._release_apart(lane, store, [release])

    def _release_apart(self, lane: Lane, store: GuardStore, released: list[Release]) -> None:
        """Run ``released`` (a key's followers) in a task of its own, stopped by :meth:`close`."""
        task = asyncio.create_task(self._release(lane, store, released))
        self._reaped.add(task)
        task.add_done_callback(self._reaped.discard)

    async def _record_again(self, lane: Lane, store: GuardStore) -> None:
        """Send again the ends on ``lane``'s parked keys that Redis did not answer.

        The followers each releases run here, as those of a release taken over.
        """
        unrecorded = self._unrecorded
        kept = unrecorded.take(lane.name)
        if not kept:
            return
        try:
            answers = await store.end_many(kept)
        except (rexc.RedisError, OSError) as exc:
            unrecorded.put_back(lane.name, kept)
            if lane.name not in unrecorded.failing:  # once until Redis records them
                unrecorded.failing.add(lane.name)
                log.warning(
                    "lane %s: parking unavailable, could not record %d ends on parked keys"
                    " again (sent again at every tick until Redis answers; said once): %s",
                    lane.name,
                    len(kept) + unrecorded.count(lane.name),
                    exc,
                )
            return
        unrecorded.failing.discard(lane.name)
        recorded = unrecorded.recorded.pop(lane.name, 0) + len(kept)
        if unrecorded.count(lane.name):  # the rest at the next ticks: one line for them all
            unrecorded.recorded[lane.name] = recorded
        else:
            log.warning(
                "lane %s: recorded %d ends on parked keys that Redis had not answered (%d"
                " dropped past the bound meanwhile); their keys' held followers are released",
                lane.name,
                recorded,
                unrecorded.dropped.pop(lane.name, 0),
            )
        for released in answers:
            if released:
                self._release_apart(lane, store, released)

    async def _record_at_close(self, lane: str, store: GuardStore) -> None:
        """Send ``lane``'s kept ends before this member stops; one line if Redis refuses them."""
        failure: Exception | None = None
        while not failure and (kept := self._unrecorded.take(lane)):
            try:
                await store.end_many(kept)
            except (rexc.RedisError, OSError) as exc:
                self._unrecorded.put_back(lane, kept)
                failure = exc
        if failure is None:
            return
        lost = self._unrecorded.take(lane)
        log.error(
            "lane %s: this member stops with %d ends on parked keys that Redis did not record"
            " (%s, ...): %s; the followers held behind those messages are not released, and"
            " wait in Redis until their key's state expires",
            lane,
            len(lost) + self._unrecorded.count(lane),
            ", ".join(ends.ends[0][0].ident for ends in lost[:3]),
            failure,
        )

    async def close(self) -> None:
        """Stop releases taken over from other members (their leases lapse and return).

        Ends on parked keys still kept (:class:`_Unrecorded`) are sent once more: they alone
        release their keys' held followers. Those followers are not run here: their release's
        lease lapses and another member takes it over.
        """
        await cancel_until_done(*self._reaped)  # their handlers may lose a first cancellation
        for name in self._unrecorded.lanes():
            await self._record_at_close(name, self._stores[name])
        for claims in self._claims.values():
            await claims.close()


def _answered(
    claims: LaneClaims | None, start: Start, decision: Decision, starts: int, *, ordered: bool
) -> Decision:
    """The decision to carry out for ``start``; ``claims`` told what it says of the key.

    A ``process`` of no starts is the window failing open (Redis did not answer): it says
    nothing of the key, which may be parked, so ``claims`` is not told. A retry copy of an
    ordered lane let through so may be its parked key's head, whose end alone releases the
    followers held behind it: it runs as one (``head``), its end recorded in ``gd_end_many``
    (kept and sent again if Redis does not answer).
    """
    if decision == "process" and not starts:
        return "head" if ordered and start.ident != start.position else decision
    if claims is not None:
        claims.decided(start.key, decision)
    return decision


def _tell(lane: Lane, start: Start, what: str) -> None:
    """Log one decision of the guard about ``start`` (``decisions``, DEBUG)."""
    decisions.debug(
        "%s: %s read at %s (attempt %d, key %s): %s",
        lane.name,
        start.ident,
        start.position,
        start.attempt,
        start.key,
        what,
    )


def ordered_retries(lane: Lane) -> bool:
    """Whether ``lane`` keeps per-key order across retries (parking): ordered, with tiers."""
    return lane.spec.ordered and bool(lane.routes.retry_topics)


def _drain_grace_ms(lane: Lane, store: GuardStore) -> int:
    """How long a lane that no longer parks waits for a parked head's copy before letting it go.

    Twice its longest tier's delay plus a release lease: the copy of a head still in a tier the
    lane reads comes back by then, and its end releases the followers in order. None comes back
    to a lane without tiers (no member reads them): its followers are released at once.
    """
    if not lane.routes.retry_topics:
        return 0
    return 2 * max(lane.spec.retry.tiers_ms) + store.lease_ms


def _released_start(release: Release) -> Start:
    """The start of a follower released from its parked key."""
    return Start(release.ident, release.key, RELEASED_POSITION, ordered=True, attempt=0)


def _given_back(unrun: Sequence[Release]) -> list[tuple[Start, Ending]]:
    """The ends of released followers that did not run: they wait where they were."""
    return [(_released_start(release), "back") for release in unrun]


def _follow(lane: Lane) -> bool:
    return lane.spec.retry.after_dead_letter == "follow"


def _ending(lane: Lane, outcome: str | None) -> Ending:
    ending = _ENDINGS.get(outcome or "", "done")
    return "done" if ending == "parked" and not ordered_retries(lane) else ending
