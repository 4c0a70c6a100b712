"""The coalescing debouncer: one turn per conversation burst, every message in order.

People send "hi", then "is the shop open", then "on Sunday", seconds apart: three messages, one
turn that sees all three. On a lane declared with ``debounce:`` (see
:class:`~pipeline.topics.spec.DebouncePolicy`) the runtime hands every message to
:meth:`Debouncer.record` instead of its handler; a :class:`~pipeline.admission.debounce.runner.
TurnRunner` per member process later hands the handler a :class:`Turn`: every message of the
conversation since its last turn, in the order they were recorded.

How (all in Redis, one function call per step, ``lua/debounce.lua`` through the typed wrappers
of :mod:`pipeline.admission.debounce.functions`):

- ``record`` appends the message to the conversation's buffer, stamps the conversation's marker
  with the message's id and (re)schedules its turn in the lane's sorted set of due times:
  ``due = min(last_arrival + quiet, first_arrival + max_wait)``, or now when the buffer holds
  ``max_batch`` messages. A newer message moves the due time: the scheduled turn is superseded
  at no cost (nothing fires for it). Idle conversations cost nothing: there is no task or timer
  per key, only sorted-set members for conversations with buffered messages. A record that
  makes a turn due before any runner's timer pushes that time onto the lane's wake list, which
  wakes one runner blocked on it (``BLPOP``): no runner polls.
- ``claim`` leases up to N due conversations at once and returns their turns. While the lease
  holds, no other member claims the key, so a key's turns never overlap; a member that dies
  holding a lease leaves the key to be claimed again when the lease runs out (attempt + 1).
- ``finish`` ends a turn: on success exactly the turn's messages leave the buffer; messages that
  arrived during the turn stay, and their turn is scheduled by their own arrival times. On
  failure every message stays and the turn is due again after a backoff, its attempt raised
  (the time of its first failure is kept until a turn of the key succeeds).
- ``step`` is what a runner calls: it finishes the turns the runner ended since its last call
  and claims what is due, in one call; the runner then holds the timer for the lane's next due
  time.

Delivery guarantees: a buffered message is in exactly one turn that succeeds, unless a turn
outlives its lease (renewed by the runner while it runs) or its ``finish`` is lost with Redis:
then the turn runs again (a duplicate, never a drop). When Redis cannot be reached ``record``
raises :class:`~pipeline.errors.DebounceUnavailable` and the runtime processes the message on
its own (fail open: a possible extra turn, never a dropped message).

All times (due, fired, arrival) are Redis server milliseconds (``TIME``), so members with
skewed clocks agree. The Redis client must return bytes (``decode_responses=False``).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis.asyncio import Redis

from pipeline.admission.debounce.codec import BufferedMessage, decode, encode
from pipeline.admission.debounce.functions import (
    DebounceFunctions,
    Ending,
    Leased,
    Outcome,
    Renewal,
)
from pipeline.admission.keys import key_text
from pipeline.envelope import Message
from pipeline.errors import DebounceUnavailable
from pipeline.redis_functions import FAILED, LONGEST_EXPIRY_MS
from pipeline.topics.spec import DebouncePolicy

__all__ = [
    "BufferedMessage",
    "Claim",
    "DebounceStats",
    "Debouncer",
    "Ending",
    "Finish",
    "Renewal",
    "Step",
    "Turn",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
LATENESS_SAMPLES = 100_000
"""How many lateness samples :class:`DebounceStats` keeps (the newest)."""

Finish = Outcome
"""What ``finish`` did: nothing left buffered; a next turn scheduled; lease lost (no change)."""
GRACE_MS = 1_000
"""How long past the armed due time a record treats the runner holding that timer as gone."""
HELD_TTL_MS = 7 * 24 * 3_600_000
"""The bound, past ``max_wait_s``, on a buffered event's locator (where the ingress's sweeper
finds it): Kafka's default retention. A locator is deleted by the finish that takes its event
out of the buffer, so it lasts as long as the event waits (a night without members or ingress,
a turn failing for hours); the bound only ends one that no finish deleted (a finish of an
earlier release deletes only those of a conversation's last 64 events)."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One claimed turn of one conversation.

    Attributes:
        lane: the debounced lane.
        key: the conversation key.
        messages: every buffered message of the key since its last turn (at most ``max_batch``),
            in the order they were recorded.
        attempt: 1 for the first run of these messages; raised by each failed or abandoned run
            (the caller dead-letters the turn after as many attempts as it allows).
        due_ms: when the turn was due (Redis clock, ms since the epoch).
        fired_ms: when it was claimed (Redis clock); ``fired_ms - due_ms`` is its lateness.
        token: the lease token; ``finish`` and ``renew`` act only while it holds the lease.
        arrivals_ms: when each message was recorded (Redis clock), for waiting-time metrics.
        first_failure_ms: when the first failed run of these messages finished (Redis clock),
            kept until a turn of the key succeeds; None before any run of them failed.
    """

    lane: str
    key: str
    messages: tuple[BufferedMessage, ...]
    attempt: int
    due_ms: int
    fired_ms: int
    token: str
    arrivals_ms: tuple[int, ...] = ()
    first_failure_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """The result of one :meth:`Debouncer.claim` call.

    Attributes:
        turns: the claimed turns, earliest due first.
        now_ms: Redis time of the claim.
        next_due_ms: the earliest due time left in the lane (leases included), or None.
    """

    turns: tuple[Turn, ...]
    now_ms: int
    next_due_ms: int | None


@dataclass(frozen=True, slots=True)
class Step:
    """The result of one :meth:`Debouncer.step` call.

    Attributes:
        turns: the claimed turns, earliest due first.
        outcomes: how each finished turn ended, in the order they were given.
        now_ms: Redis time of the call.
        timer_ms: the due time the caller must now hold a timer for (Redis clock), or None.
        backup_ms: when the caller must step again in case the runner holding the lane's timer
            died (Redis clock: that runner's hold expires then), or None. Set only when the
            caller leased nothing and another runner holds the timer for the next due time.
    """

    turns: tuple[Turn, ...]
    outcomes: tuple[Finish, ...]
    now_ms: int
    timer_ms: int | None
    backup_ms: int | None = None


@dataclass
class DebounceStats:
    """Counters of one :class:`Debouncer` (and the runners that use it).

    Attributes:
        recorded: messages recorded.
        superseded: scheduled turns replaced by a newer message's (they never fire on their own).
        turns: turns claimed.
        stale: due entries that had nothing left to run (a one-call no-op inside ``claim``).
        messages_per_turn: turn size -> how many turns had it (a histogram).
        lateness_ms: the newest samples of ``fired_ms - due_ms``, one per claimed turn.
        failed_turns: turns finished with ``ok=False``.
        lost_leases: ``finish`` calls whose lease had already passed to another member.
        redis_calls: Redis calls made (every function call and blocking read of the wake
            list; the library load is not counted).
        fail_open: messages ``record`` could not buffer (processed on their own instead).
        repeated: messages ``record`` found already recorded (redeliveries), or copies of an
            event still buffered (replays): not buffered again.
        wakeups: wake-ups read from the wake list (a runner learnt of an earlier due time).
        steps: ``step`` calls (each finishes and claims in one round trip).
    """

    recorded: int = 0
    superseded: int = 0
    turns: int = 0
    stale: int = 0
    messages_per_turn: Counter[int] = field(default_factory=Counter)
    lateness_ms: deque[int] = field(default_factory=lambda: deque(maxlen=LATENESS_SAMPLES))
    failed_turns: int = 0
    lost_leases: int = 0
    redis_calls: int = 0
    fail_open: int = 0
    repeated: int = 0
    wakeups: int = 0
    steps: int = 0


class Debouncer:
    """Typed wrappers around the ``db_*`` functions for one lane; one per (lane, Redis client)."""

    def __init__(
        self,
        redis: Redis,
        prefix: str,
        lane: str,
        policy: DebouncePolicy,
        *,
        lease_ms: int = 30_000,
        idle_ttl_ms: int = 600_000,
        grace_ms: int = GRACE_MS,
        held_ttl_ms: int = HELD_TTL_MS,
    ) -> None:
        """Debounce ``lane`` with ``policy``, keeping its state under ``prefix``.

        Args:
            redis: a client returning bytes.
            prefix: the key prefix (``Settings.redis.key_prefix``).
            lane: the lane's name.
            policy: quiet period, maximum wait and batch size.
            lease_ms: how long a claimed turn holds its key before another member may claim it
                (the runner renews it while the turn runs).
            idle_ttl_ms: how long the state of a conversation with nothing buffered is kept.
            grace_ms: how long past an armed due time before a record wakes another runner.
            held_ttl_ms: a buffered event stays findable by the ingress's sweeper
                (:class:`~pipeline.admission.debounce.held.BufferedEvents`) until its turn
                succeeds, however long it waits; this bounds, past ``max_wait_s``, a locator no
                finish deleted (:data:`HELD_TTL_MS`; the lane's retention, if longer, keeps
                events findable that long).
        """
        self._token_prefix = uuid.uuid4().hex[:12]
        self.functions = DebounceFunctions(
            redis, prefix, lane, owner=self._token_prefix, grace_ms=grace_ms
        )
        self.lane = lane
        self.policy = policy
        self.lease_ms = lease_ms
        self._idle_ttl_ms = idle_ttl_ms
        self._quiet_ms = round(policy.quiet_s * 1000)
        self._max_wait_ms = round(policy.max_wait_s * 1000)
        self._held_ttl_ms = min(self._max_wait_ms + held_ttl_ms, LONGEST_EXPIRY_MS)
        self._policy = (self._quiet_ms, self._max_wait_ms, policy.max_batch)
        self._claims = 0
        self._listeners: list[Callable[[int], None]] = []
        self._superseding: list[Callable[[], None]] = []
        self.stats = DebounceStats()

    def subscribe(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(due_ms)`` after each successful local ``record`` (wakes a runner)."""
        self._listeners.append(listener)

    def on_superseded(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` for each local ``record`` that replaced a scheduled turn."""
        self._superseding.append(listener)

    async def record(self, key: str, message: Message | BufferedMessage) -> int:
        """Buffer ``message`` for conversation ``key`` and schedule the key's turn.

        One ``FCALL db_record``. A message among the last 64 recorded for ``key`` (same id and
        timestamp: a redelivery after a crash before the commit, or a call retried after it
        had run) is not buffered again, while the key's state lives (``idle_ttl_ms`` after its
        last turn); nor is a message whose ``pl-event-id`` a message still buffered for ``key``
        had (waiting or in its running turn), however many were recorded since: a copy the
        ingress's sweeper replayed at another offset. A lone surrogate in ``key`` (half a
        surrogate pair escaped in JSON) is stored, and given to the turn, as U+FFFD.

        Returns:
            When the key's turn is due (Redis clock, ms); while a turn of the key is running,
            the end of its lease (the rest is scheduled when it finishes); -1 for a message
            already recorded, or a copy of a buffered event (counted in ``stats.repeated``).

        Raises:
            DebounceUnavailable: Redis cannot be reached; process the message on its own.
        """
        buffered = message if isinstance(message, BufferedMessage) else BufferedMessage.of(message)
        record = self.functions.record(
            key_text(key),
            buffered.message_id,
            encode(buffered),
            self._quiet_ms,
            self._max_wait_ms,
            self.policy.max_batch,
            buffered.timestamp_ms,
            buffered.event_digest,
            self._held_ttl_ms,
        )
        try:
            reply = await self._call(record)
        except DebounceUnavailable:
            self.stats.fail_open += 1
            log.warning(
                "debounce unavailable on lane %s: %s processed on its own",
                self.lane,
                buffered.message_id,
            )
            raise
        if reply.due_ms < 0:
            self.stats.repeated += 1
            return reply.due_ms
        self.stats.recorded += 1
        if reply.superseded:
            self.stats.superseded += 1
            for superseded in self._superseding:
                superseded()
        for listener in self._listeners:
            listener(reply.due_ms)
        return reply.due_ms

    async def claim(self, limit: int) -> Claim:
        """Lease up to ``limit`` due conversations and return their turns (one ``FCALL db_claim``).

        Raises:
            DebounceUnavailable: Redis cannot be reached.
        """
        leased = await self._call(
            self.functions.claim(limit, self.lease_ms, self.policy.max_batch, self._token())
        )
        turns = self._turns(leased)
        return Claim(turns, leased.now_ms, leased.timer_ms)

    async def step(self, limit: int, endings: Sequence[Ending] = (), pass_at: int = 0) -> Step:
        """Finish ``endings`` and lease up to ``limit`` due turns, in one ``FCALL db_step``.

        With ``limit`` > 0 the caller takes the timer for the lane's next due time
        (``timer_ms``), unless it leased ``pass_at`` turns or more (0: never): then the timer
        goes to the next runner blocked on the wake list; or unless it leased nothing and
        another runner holds that timer: then the caller steps again at ``backup_ms``, when that
        runner's hold expires (it takes the timer over if that runner died). With ``limit`` 0
        it only finishes, and holds a timer for a next turn it scheduled before any armed time.

        Raises:
            DebounceUnavailable: Redis cannot be reached (nothing was finished or claimed).
        """
        self.stats.steps += 1
        leased = await self._call(
            self.functions.step(
                limit,
                self.lease_ms,
                self._token(),
                endings,
                self._policy,
                self._idle_ttl_ms,
                pass_at,
            )
        )
        for ending, outcome in zip(endings, leased.outcomes, strict=True):
            self._count_finish(ending.key, ok=ending.ok, outcome=outcome)
        turns = self._turns(leased)
        return Step(turns, leased.outcomes, leased.now_ms, leased.timer_ms, leased.backup_ms)

    async def wait_wake(self, client: Redis, timeout_s: float) -> int | None:
        """Block up to ``timeout_s`` on the lane's wake list; the due time read, or None.

        ``client`` holds one connection of its own (a blocked read occupies it).

        Raises:
            DebounceUnavailable: Redis cannot be reached.
        """
        due_ms = await self._call(self.functions.wait_wake(client, timeout_s))
        self.stats.wakeups += due_ms is not None
        return due_ms

    async def wake(self, due_ms: int) -> None:
        """Hand the timer for ``due_ms`` to a runner blocked on the wake list.

        Raises:
            DebounceUnavailable: Redis cannot be reached.
        """
        await self._call(self.functions.wake(due_ms))

    async def finish(self, turn: Turn, *, ok: bool, retry_in_ms: int = 0) -> Finish:
        """End ``turn`` (one ``FCALL db_finish``).

        Args:
            turn: a turn from :meth:`claim`.
            ok: True if it succeeded: its messages leave the buffer. False: they stay, the
                attempt count rises (the first failure's time is kept: ``first_failure_ms``)
                and the turn is due again in ``retry_in_ms``.
            retry_in_ms: the backoff after a failure.

        Returns:
            ``done`` (nothing left), ``scheduled`` (a next turn is due) or ``lost`` (the lease
            had passed to another member, which runs the messages again; nothing changed).

        Raises:
            DebounceUnavailable: Redis cannot be reached; the lease runs out and the turn
                runs again.
        """
        ending = Ending(turn.key, turn.token, ok, retry_in_ms)
        finished = await self._call(self.functions.finish(ending, self._policy, self._idle_ttl_ms))
        self._count_finish(turn.key, ok=ok, outcome=finished.outcome)
        return finished.outcome

    def _count_finish(self, key: str, *, ok: bool, outcome: Finish) -> None:
        if not ok:
            self.stats.failed_turns += 1
        if outcome == "lost":
            self.stats.lost_leases += 1
            log.warning(
                "debounce lease of %s on lane %s lost before its turn finished", key, self.lane
            )

    async def renew(self, turn: Turn) -> Renewal:
        """Extend the lease of a running ``turn`` by ``lease_ms`` (``renewed``).

        ``taken``: its lease lapsed (its runner stalled past it) and a claim took the turn over:
        another runner runs it now or has run it; ``lost``: the lease is gone and no claim took
        it over (the state went with Redis's data, even if a new turn of the conversation has
        been claimed since): its messages may be nowhere else.

        Raises:
            DebounceUnavailable: Redis cannot be reached.
        """
        return await self._call(self.functions.renew(turn.key, turn.token, self.lease_ms))

    async def next_due_ms(self) -> int | None:
        """The lane's earliest due time (Redis clock, ms), or None when nothing is buffered.

        Raises:
            DebounceUnavailable: Redis cannot be reached.
        """
        return await self._call(self.functions.next_due())

    def _token(self) -> str:
        self._claims += 1
        return f"{self._token_prefix}:{self._claims}"

    async def _call(self, call: Awaitable[T]) -> T:
        self.stats.redis_calls += 1
        try:
            return await call
        except FAILED as exc:  # any failure fails open, never drops
            raise DebounceUnavailable(f"debounce on lane {self.lane}: {exc}") from exc

    def _turns(self, leased: Leased) -> tuple[Turn, ...]:
        self.stats.stale += leased.stale
        turns = tuple(self._turn(raw, leased.now_ms) for raw in leased.turns)
        for turn in turns:
            self.stats.turns += 1
            self.stats.messages_per_turn[len(turn.messages)] += 1
            self.stats.lateness_ms.append(max(0, turn.fired_ms - turn.due_ms))
        return turns

    def _turn(self, raw: list[Any], now_ms: int) -> Turn:
        messages, arrivals_ms = [], []
        for element in raw[5:]:
            arrival, _, data = bytes(element).partition(b":")
            arrivals_ms.append(int(arrival))
            messages.append(decode(data))
        return Turn(
            lane=self.lane,
            key=raw[0].decode(),
            messages=tuple(messages),
            attempt=int(raw[2]),
            due_ms=int(raw[3]),
            fired_ms=now_ms,
            token=raw[1].decode(),
            arrivals_ms=tuple(arrivals_ms),
            first_failure_ms=None if int(raw[4]) < 0 else int(raw[4]),
        )
