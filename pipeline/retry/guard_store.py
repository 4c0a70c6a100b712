"""The run guard's state in Redis: start marks, poison counters and per-key parking.

**Start marks (poison detection).** Before a message runs, a mark ``starts|position`` is written
for its id (where it was first delivered, stable across retry tiers); when it ends, the mark is
deleted. The mark names the member process that wrote it, and each process renews its
liveness every commit tick (``gd_live``, ``live_ms``). A copy that finds a mark of its own
position written by another process that is still alive waits (``busy``): that process lost the
partition to a stall, not a crash, and still runs the copy. Otherwise the copy was started
before and never finished (its member died, or lost it mid-run): a *suspect*, which the member
runs alone
(``runtime/isolation.py``) so that a crash cannot be blamed on a neighbour. Once its
interruptions, the first plus its lone starts, reach ``poison_after``, it is dead-lettered with
reason ``poison``. A copy that finds a mark of *another* position is a duplicate (a member killed
between producing a retry and committing it): the marked copy finishes, or, not being committed,
is delivered again, so the duplicate is dropped and never runs beside it. A start that failed
and produced its retry copy does not delete its mark at its end: it leaves it with no start
(``0|position|attempt``) for that copy to take over. Until then the failed copy, delivered again
because its offset was not committed yet, is stale: were it to take the mark and its member
die before running it, the retry copy would be dropped as a duplicate of a start that never
runs again, its offset committed as done since the failure.

**Parking (ordered retries).** On an ordered lane, when a message fails and goes to a retry tier,
its key is *parked*: the message is the key's head. Later messages of that key are *held*: each is
written once, whole, into Redis behind the head (``held``), its offset is done, and it costs no
topic write. When the head succeeds, the next followers (up to ``RELEASE_BATCH``, each marked as
started) are released to the member that ran the head, which runs them in order and records
their ends in one call that releases the next ones; and so on until the key has nothing parked.
A follower that fails becomes the head and goes to a retry tier like any failure; those
released after it did not run and wait where they were, their marks undone (``back``). A
suspect, or a follower of a dead-lettered head, is released alone. A dead-lettered head is followed
into the dead-letter topic by those parked behind it (``after_dead_letter: follow``, reason
``sequenced``) or releases them to run (``proceed``). A release holds a lease, renewed while it
runs; a member that dies mid-release leaves the lease to expire and another member's reaper
takes the release over.

**Where a key is parked from.** A first delivery that parks its key (its failure or deferral
routed to a tier) records where from: its main topic partition and the lowest offset of the key
its member has not finished there (:attr:`Start.below`; its own, unless an earlier one was left
unrouted). The key lanes run a key's messages one at a time, in order, so every earlier message
of the key the member read from that partition has finished. A first delivery of it ran
unmarked, its end implied by the commit; the member killed before that commit, it is read
again, and held behind the head it would run again after it, out of order. Read from that
partition below where the key is parked from, and not in the key's parked set, it is ``stale``
instead; a delivery from another partition, at or above that offset, or in the parked set is
decided as before. The record goes with the key's state.

**A lane that stops parking.** Declared unordered, or left without retry tiers, while keys are
parked, a lane no longer parks, but its members still drain what it parked (``gd_reap``'s
drain): a retry copy that is its parked key's head runs as that head, and its end releases the
followers as above (order kept); the reap tick releases the followers of a key whose head's copy
is not expected: at once on a lane without tiers (no member reads them), else once the key's
state has not changed for twice the longest tier's delay plus a lease, its head's copy not
running. Those followers then run before that copy, if it ever comes (the lane keeps no order
across retries any more); each runs at least once, as any release. Only a retry copy asks, and
only while the lane has parked keys (counted by each reap): first deliveries pay nothing.

**Cost.** Starts and ends of messages whose key is not parked are batched: one ``gd_begin`` call
for all the starts the member makes in one turn of its event loop, carrying the ends recorded
since the last call; ends left over are flushed before every commit. A start of a key the
member saw parked carries its message, so ``gd_begin`` holds it at once, and a head's copy due
from its tier runs from there too. Ends on parked keys go in ``gd_end_many``, one call for those
of one turn, and a release's followers end together in one. Only a failure's ``gd_route`` and
the rarer parked-key starts (``gd_key_begin``) make a call of their own. The lane's
housekeeping (the expiry of its marks and lone-start counts, the trimming of finished ids)
rides on the periodic ``gd_reap`` instead of every ``gd_begin``.

**Expiry.** Every key expires some time after its last change, so the state of messages that
vanished frees itself: after the lane's retention plus its retry path plus an hour
(:func:`parked_state_ms`), since copies come back from the topics that long after an outage of
every member (a broken deploy over a night), when nothing renews the state. A parked key's
state (its order, its held followers, its release, its entry in the lane's index) runs held
followers whose offsets are committed: expired while the head's copy waits in its tier, they
would be lost without a word once the head ran. A key left with nothing parked has its state
deleted at once, so the long bound holds memory only for keys that still wait. The start marks
and lone-start counts are lane-wide hashes the reap tick renews while any member runs; after
the outage a delivery read again whose retry copy was produced is still stale (run, the
message would run twice), and one whose member died mid-run is still a suspect whose crash
counts (a poison message that kills its member, the fleet down past a shorter bound after each
crash, would never reach ``poison_after``). The finished ids are trimmed to the retry path
plus an hour (:func:`retry_path_ms`) of the lane's own clock, which stands still while no member
reaps the lane: a head's copy whose offset was not committed before the outage is still stale
after it, rather than held again behind, and run after, its followers. The lane's index of
parked keys and its releases in progress are renewed with every write of a key's state (and
by the reap tick), so neither expires before the state it points to: a new message of a key
whose release an outage cut short is still held behind its followers, and that release is
still taken over. Claimed ranges, written at every tick, last as long as the marks: a
crashed member's claim is what sends the range it may have been running to the exact path,
so after the outage its first deliveries are still counted as interrupted (a poison message
that downs the fleet past the retry path after each crash still reaches ``poison_after``)
and a failed one whose retry copy was produced is still stale.

If Redis cannot be reached the runtime fails open: messages run (order across retries is not
guarded for that time, and poison is not counted), and each such decision is logged.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline import headers as h
from pipeline.envelope import Message, TopicPartition
from pipeline.redis_functions import LONGEST_EXPIRY_MS, FunctionLibrary
from pipeline.retry.held import decode_held, encode_held
from pipeline.retry.keys import GuardKeys, encode_key, guard_keys
from pipeline.topics.spec import TopicSpec

log = logging.getLogger(__name__)

LIBRARY = resources.files("pipeline.retry").joinpath("lua/guard.lua").read_text()
Decision = Literal[
    "process", "suspect", "copy", "stale", "slow", "held", "head", "sequenced", "busy"
]
Ending = Literal["done", "parked", "dead", "back"]
"""How a guarded start ended: handled (``done``), sent to a retry tier (``parked``),
dead-lettered (``dead``); ``back``: a released follower that did not run (one before it failed),
which waits where it was."""
LIVE_MS = 5_000
"""How long a member process counts as alive after its last renewal (every commit tick), by
default (``runtime.liveness_ms``). A copy of one of its starts read by another process meanwhile
waits for it; after a crash, suspects wait at most this long."""
RELEASED_POSITION = "rel"
"""The position of a start made by releasing a held follower."""
RELEASE_BATCH = 32
"""Held followers released to a member in one call at most (``gd_end_many``)."""
SLACK_MS = 3_600_000
"""What the guard's state outlives a lane's retry path by (ms)."""
BROKER_RETENTION_MS = 7 * 86_400_000
"""How long a lane declared without ``retention`` keeps its messages: Kafka's default
``log.retention.hours`` of 168."""
MAX_HOLD_MS = LONGEST_EXPIRY_MS
"""The longest a parked key's state is kept (a lane may retain its messages for ever)."""


def message_id(message: Message) -> str:
    """Where the message was first delivered (``topic:partition:offset``), stable across tiers.

    Any producer can write the origin headers: unless they name a position of the message's lane
    (:func:`~pipeline.headers.origin`), the message is a first delivery, its id where it was read.
    """
    return h.origin(message.topic, message.headers) or position(message)


def position(message: Message) -> str:
    """Where this copy of the message was read (``topic:partition:offset``)."""
    return f"{message.topic}:{message.partition}:{message.offset}"


_CODES: dict[str, Decision] = {
    "p": "process",
    "s": "suspect",
    "c": "copy",
    "x": "stale",
    "w": "slow",
    "b": "busy",
    "h": "held",
    "r": "head",
}


@dataclass(slots=True)
class Start:
    """One start to decide: the message's id, its key (encoded), this copy's position."""

    ident: str
    key: str
    position: str
    ordered: bool
    attempt: int = 1
    inherited: bool = False
    """Its partition's previous owner died with this message in its claimed range
    (``runtime/claims.py``): it may have been running it, so the start counts as a second."""
    drains: bool = False
    """A retry copy on a lane that no longer parks, while keys it parked remain: if its key is
    parked and it is the key's head, it runs as that head (``head``) and its end releases the
    followers; else it is decided as an unordered start."""
    body: bytes | None = None
    """The encoded message (``retry/held.py``), sent when its key may be parked: ``gd_begin``
    then holds it behind the key's head at once (``held``) instead of answering ``slow``."""
    below: str | None = None
    """Where its key is parked from if its route parks it (``gd_route``): read from a main
    topic, ``topic:partition:offset`` of the lowest offset of the key the member has not
    finished on that partition (every earlier message of the key it read there finished).
    A delivery of the key read again from that partition below it, and not parked behind the
    key's head, is a copy of a finished message: stale. None: every one is held as before."""

    @property
    def line(self) -> str:
        """The start as ``gd_begin`` reads it (an empty position: the id itself)."""
        at = "" if self.position == self.ident else self.position
        kind = "1" if self.ordered else "2" if self.drains else "0"
        flags = (
            f"{kind}\t{self.attempt}\t{'1' if self.inherited else '0'}"
            f"\t{'0' if self.body is None else '1'}"
        )
        return f"{self.ident}\t{self.key}\t{at}\t{flags}"

    @property
    def end_line(self) -> str:
        """The end of this start as ``gd_begin`` reads it."""
        return f"{self.ident}\t{'' if self.position == self.ident else self.position}"


@dataclass(frozen=True, slots=True)
class KeyEnds:
    """Ends of one parked key recorded together, in order (``gd_end_many``)."""

    ends: Sequence[tuple[Start, Ending]]
    follow_dead: bool
    """A dead-lettered message takes the followers parked behind it along."""
    release: bool = True
    """Release the key's next followers after the last end (False: the caller keeps the
    release it has, or leaves it to lapse)."""


@dataclass(frozen=True, slots=True)
class Release:
    """A held follower handed to the member to run next, with what to do with it."""

    key: str
    decision: Decision
    ident: str
    message: Message


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _release(key: str, decision: Any, ident: Any, held: bytes) -> Release:
    """A follower as ``gd_end_many`` and ``gd_reap`` return it: decision, id, encoded message."""
    return Release(key, _text(decision), _text(ident), decode_held(held))  # type: ignore[arg-type]


class GuardStore:
    """Typed wrappers around the ``gd_*`` functions for one lane."""

    def __init__(
        self,
        client: Redis,
        prefix: str,
        lane: str,
        *,
        ttl_ms: int,
        hold_ms: int | None = None,
        lease_ms: int = 15_000,
        live_ms: int = LIVE_MS,
    ) -> None:
        """Keep the guard state of ``lane`` under ``prefix`` for ``hold_ms`` after each change.

        ``hold_ms`` (``ttl_ms`` if None) must last while copies can still come back from the
        topics, through an outage of every member (:func:`lane_guards`); claims are kept as
        long after their last write. Finished ids are kept ``ttl_ms`` of the lane's clock
        (which stands still while no member reaps the lane). ``lease_ms`` is how long a release
        stays with its member without a renewal; ``live_ms`` how long this member process counts
        as alive after each :meth:`live`.
        """
        self._client = client
        self._functions = FunctionLibrary(client, LIBRARY)
        self.lane = lane
        self.keys: GuardKeys = guard_keys(prefix, lane)
        self.ttl_ms = ttl_ms
        self.hold_ms = ttl_ms if hold_ms is None else hold_ms
        self.lease_ms = lease_ms
        self.live_ms = live_ms
        self.instance = uuid.uuid4().hex[:16]
        """This member process: written into its start marks, alive while it renews (gd_live)."""
        self.live_until_s = -math.inf
        """Until when (``time.monotonic``) the liveness last written to Redis surely holds."""
        self._live_sent = False
        self.parked = 0
        """How many keys of the lane were parked at the last :meth:`reap`."""

    async def begin_many(
        self, ended: Sequence[str], starts: Sequence[Start]
    ) -> list[tuple[Decision, int]]:
        """End ``ended`` and decide ``starts`` in one call (``FCALL gd_begin``).

        A start with a ``body`` whose key is parked behind another message is held (``held``).

        Raises redis errors: the caller decides how to fail open.
        """
        k = self.keys
        # The first call also says this process is alive; the member's tick renews it (live()).
        live_for = "" if self._live_sent else str(self.live_ms)
        text = await self._functions.fcall(
            "gd_begin",
            [k.run, k.gone, k.parked, k.alone, k.live],
            [
                self.hold_ms,
                "\n".join(ended),
                "\n".join(start.line for start in starts),
                self.instance,
                live_for,
                *(start.body for start in starts if start.body is not None),
            ],
        )
        self._live_sent = True
        if not starts:
            return []
        return [(_CODES[item[0]], int(item[1:])) for item in _text(text).split(",")]

    async def begin_parked(self, message: Message, start: Start) -> tuple[Decision, int]:
        """Decide a start of a message whose key is parked (``FCALL gd_key_begin``)."""
        k = self.keys
        z, state, held = k.of_key(start.key)
        try:
            decision, starts = await self._functions.fcall(
                "gd_key_begin",
                [k.run, k.gone, k.parked, z, state, held, k.live],
                [
                    self.hold_ms,
                    start.ident,
                    start.key,
                    start.position,
                    start.attempt,
                    encode_held(message),
                    self.instance,
                ],
            )
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, processing %s without it: %s", start.ident, exc)
            return "process", 0
        return _text(decision), int(starts)  # type: ignore[return-value]

    async def route(self, start: Start, attempt: int, *, park: bool) -> bool:
        """``start`` is about to be produced to a retry tier as ``attempt`` (``FCALL gd_route``).

        Parks its key first (``park``: an ordered lane), so the copy never finds it unparked,
        and lets that copy take the start mark over. A key this parks keeps ``start.below``:
        a delivery read again from below it is stale rather than held behind the head. False
        if Redis failed (logged).
        """
        k = self.keys
        z, state, _ = k.of_key(start.key)
        try:
            await self._functions.fcall(
                "gd_route",
                [k.run, k.gone, k.parked, z, state],
                [
                    self.hold_ms,
                    start.ident,
                    start.key,
                    start.position,
                    attempt,
                    "1" if park else "0",
                    start.below or "",
                ],
            )
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, routing %s without it: %s", start.ident, exc)
            return False
        return True

    async def end_many(self, groups: Sequence[KeyEnds]) -> list[list[Release]]:
        """Record the ends of several parked keys in one call (``FCALL gd_end_many``), in order.

        Each group gets the followers released to this member after its last end, to run next
        in order (none if it asked for none). Raises redis errors: the caller decides how to
        fail open.
        """
        k = self.keys
        args: list[str | int] = [
            self.hold_ms,
            self.lease_ms,
            k.tag,
            self.instance,
        ]
        for group in groups:
            follow = "follow" if group.follow_dead else ""
            last = len(group.ends) - 1
            for i, (start, ending) in enumerate(group.ends):
                release = RELEASE_BATCH if group.release and i == last else 0
                args += [start.ident, start.key, ending, follow, start.position, release]
        replies = await self._functions.fcall(
            "gd_end_many", [k.run, k.alone, k.gone, k.parked, k.releases], args
        )
        out: list[list[Release]] = []
        at = 0
        for group in groups:
            flat = replies[at + len(group.ends) - 1]
            at += len(group.ends)
            key = group.ends[0][0].key
            out.append([_release(key, *flat[i : i + 3]) for i in range(0, len(flat), 3)])
        return out

    async def solo(self, start: Start, *, poison_after: int) -> tuple[str, int]:
        """Count a suspect's lone start (``FCALL gd_solo``): (process|poison|stale, lone starts)."""
        k = self.keys
        try:
            verdict, alone = await self._functions.fcall(
                "gd_solo",
                [k.run, k.alone, k.gone],
                [start.ident, start.position, self.hold_ms, poison_after],
            )
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, running suspect %s uncounted: %s", start.ident, exc)
            return "process", 0
        return _text(verdict), int(alone)

    async def reap(self, *, limit: int = 16, drain_ms: int | None = None) -> list[Release]:
        """Take over releases whose lease expired (``FCALL gd_reap``).

        ``drain_ms``: the lane no longer parks (unordered, or without retry tiers), so its
        members release what it parked before: each parked key with no release in progress
        releases its next follower here, its head let go once it waited ``drain_ms`` in a tier
        without a change (its copy, if any, is then not waited for). Sets :attr:`parked`.
        """
        k = self.keys
        drain = "" if drain_ms is None else str(drain_ms)
        try:
            reply = await self._functions.fcall(
                "gd_reap",
                [k.releases],
                [self.ttl_ms, self.hold_ms, self.lease_ms, k.tag, limit, self.instance, drain],
            )
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, could not look for stalled releases: %s", exc)
            return []
        self.parked = int(reply[0])
        flat = reply[1:]
        return [_release(_text(flat[i]), *flat[i + 1 : i + 4]) for i in range(0, len(flat), 4)]

    async def live(self) -> None:
        """Say this member process is alive for ``live_ms`` more (``FCALL gd_live``).

        While it is, a copy of one of its running starts read by another member process waits
        (``busy``) instead of running beside it as a suspect.
        """
        sent_s = time.monotonic()
        try:
            await self._functions.fcall("gd_live", [self.keys.live], [self.instance, self.live_ms])
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, could not renew this member's liveness: %s", exc)
            return
        self.live_until_s = sent_s + self.live_ms / 1000

    # -- claimed ranges (runtime/claims.py) ------------------------------------------------------

    async def take_claims(
        self, ranges: Mapping[TopicPartition, tuple[int, int]]
    ) -> dict[TopicPartition, tuple[int, dict[str, tuple[int, int]]]]:
        """The partitions were assigned here: become their owner and claim them (``gd_take``).

        ``ranges`` holds, per partition, ``lo`` (its committed position) and the least ``hi``
        to claim; the claim reaches up to the top of every other process's claim too. Returns
        per partition the ``hi`` claimed and those other claims (instance -> (lo, hi)), read in
        the same step. Other claims wholly below ``lo`` (finished work) are deleted instead.
        Raises redis errors: the caller decides how to fail open.
        """
        tps = list(ranges)
        answer = await self._claims_call("gd_take", tps, ranges)
        out: dict[TopicPartition, tuple[int, dict[str, tuple[int, int]]]] = {}
        for tp, (hi, flat) in zip(tps, answer, strict=True):
            others: dict[str, tuple[int, int]] = {}
            for i in range(0, len(flat), 2):
                lo_text, _, hi_text = _text(flat[i + 1]).partition("|")
                others[_text(flat[i])] = (int(lo_text), int(hi_text))
            out[tp] = (int(hi), others)
        return out

    async def claim(self, ranges: Mapping[TopicPartition, tuple[int, int]]) -> set[TopicPartition]:
        """Write this process's claims ``lo..hi`` again, grown or renewed (``gd_claim``).

        Returns the partitions another process was assigned since this one took them: their
        claims are left as they were.
        Raises redis errors: the caller decides how to fail open.
        """
        tps = list(ranges)
        written = await self._claims_call("gd_claim", tps, ranges)
        return {tp for tp, ok in zip(tps, written, strict=True) if not ok}

    async def _claims_call(
        self,
        function: str,
        tps: Sequence[TopicPartition],
        ranges: Mapping[TopicPartition, tuple[int, int]],
    ) -> Any:
        """``FCALL function`` over the claims of ``tps``: this instance, the expiry, the ranges.

        A claim lasts as long as the marks (``hold_ms``): left behind by a crash, it is what
        makes the partition's next owner take the exact path for the range, and that owner may
        come only after an outage of every member (see the module's **Expiry**).
        """
        args: list[object] = [self.instance, self.hold_ms]
        for tp in tps:
            args += ranges[tp]
        keys = [self.keys.claims(tp.topic, tp.partition) for tp in tps]
        return await self._functions.fcall(function, keys, args)

    async def unclaim(self, tps: Sequence[TopicPartition]) -> bool:
        """Give up this process's claims on ``tps`` (``gd_unclaim``), and its ownership of them.

        False if Redis failed (and logged).
        """
        if not tps:
            return True
        keys = [self.keys.claims(tp.topic, tp.partition) for tp in tps]
        try:
            await self._functions.fcall("gd_unclaim", keys, [self.instance])
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, could not give up %d claims: %s", len(tps), exc)
            return False
        return True

    async def claiming(
        self, tp: TopicPartition, instances: Sequence[str]
    ) -> tuple[list[str], list[str]]:
        """Those of ``instances`` that still claim ``tp``: alive (they may run its work), dead.

        A process that gave its claim up is in neither: its work there ended.
        Raises redis errors: the caller decides how to fail open.
        """
        key = self.keys.claims(tp.topic, tp.partition)
        pipe = self._client.pipeline(transaction=False)
        pipe.hmget(key, list(instances))
        pipe.hmget(self.keys.live, list(instances))
        pipe.time()  # liveness is written in Redis's clock (gd_live), so it is judged by it
        claimed, until, (now_s, now_us) = await pipe.execute()
        now_ms = now_s * 1000 + now_us // 1000
        alive: list[str] = []
        dead: list[str] = []
        for instance, claim, live in zip(instances, claimed, until, strict=True):
            if claim is not None:
                (alive if live is not None and int(live) > now_ms else dead).append(instance)
        return alive, dead

    async def parked_count(self) -> int:
        """How many keys have parked messages now (one ``HLEN``).

        Raises redis errors: the caller decides how to fail open.
        """
        return int(await self._client.hlen(self.keys.parked))

    async def parked_keys(self) -> set[str]:
        """The (encoded) keys that have parked messages now.

        Raises redis errors: the caller decides how to fail open.
        """
        return {_text(key) for key in await self._client.hkeys(self.keys.parked)}

    async def renew(self, keys: Sequence[str]) -> None:
        """Extend the leases of this member's releases in progress (``FCALL gd_renew``)."""
        if not keys:
            return
        try:
            await self._functions.fcall(
                "gd_renew",
                [self.keys.releases],
                [self.lease_ms, *keys],
            )
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, could not renew %d releases: %s", len(keys), exc)


def start_of(message: Message, *, ordered: bool) -> Start:
    """The start of ``message`` as the guard records it."""
    at = position(message)
    headers = message.headers
    origin = h.origin(message.topic, headers)
    if origin is None:  # a first delivery: its id is where it was read
        if h.ORIGIN_TOPIC in headers:  # the line names no header's bytes: repeats back off
            # On a main topic they are a copy's headers produced there again (a dead letter
            # re-produced by hand): expected, not worth a warning. On a tier, garbage.
            level = logging.WARNING if h.retry_tier(message.topic) else logging.DEBUG
            log.log(
                level,
                "%s: its origin headers do not count (%s): run as a first delivery, with that id",
                at,
                h.origin_fault(message.topic, headers),
            )
        return Start(at, encode_key(message.key), at, ordered, 1)
    return Start(origin, encode_key(message.key), at, ordered, h.attempt(message.topic, headers))


def retry_path_ms(spec: TopicSpec) -> int:
    """How long finished ids last: the retry path plus an hour.

    Twice the longest tier's delay for each attempt, plus :data:`SLACK_MS`. Finished ids count
    it on the lane's clock, which stands still while every member is down.
    """
    return max(spec.retry.tiers_ms or (0,)) * (spec.retry.max_attempts + 1) * 2 + SLACK_MS


def copy_lifetime_ms(spec: TopicSpec) -> int:
    """How long a copy of a message of ``spec``'s lane can still come back to a member.

    The longest retention among the lane's topics (its dead letters': at least
    :data:`~pipeline.topics.spec.DLQ_MIN_RETENTION_MS`, or the lane's retention if longer; an
    undeclared retention is :data:`BROKER_RETENTION_MS`), plus its retry path
    (:func:`retry_path_ms`): a dead letter may be redriven on its topic's last day. What must
    hold for as long (``ctx.once`` records, cancellations) is kept this long; at most
    :data:`MAX_HOLD_MS`.
    """
    kept_ms = max(
        BROKER_RETENTION_MS if topic.retention_ms is None else topic.retention_ms
        for topic in spec.topic_configs(0)
    )
    return min(kept_ms + retry_path_ms(spec), MAX_HOLD_MS)


def parked_state_ms(spec: TopicSpec) -> int:
    """How long the guard's state lasts after each change: the lane's retention, and the path.

    Its held followers' offsets are committed, so Redis keeps their only copy; they run once
    the head's copy comes back from its tier, which keeps it for the lane's retention (the
    broker's default, :data:`BROKER_RETENTION_MS`, when the lane declares none) or longer.
    While the whole fleet is down (a broken deploy over a night) nothing renews the state, so
    it must last that long, not just the retry path. A key that has nothing parked any more
    has its state deleted at once, so this costs memory only for keys that still wait. The
    lane's marks and lone-start counts last as long: renewed while any member runs, the bound
    counts only through an outage, after which a copy read again needs them; so do the
    claims, which tell the partition's next owner which first deliveries may have been running.
    """
    retention_ms = BROKER_RETENTION_MS if spec.retention_ms is None else spec.retention_ms
    return min(retention_ms + retry_path_ms(spec), MAX_HOLD_MS)


def lane_guards(
    client: Redis, prefix: str, specs: Sequence[TopicSpec], *, live_ms: int = LIVE_MS
) -> dict[str, GuardStore]:
    """The guard store of each lane: its state lasts :func:`parked_state_ms`.

    Finished ids last :func:`retry_path_ms`. ``live_ms`` is both this process's
    liveness and its release leases (both renewed every commit tick): after a crash, its
    suspects and its releases wait this long.
    """
    return {
        spec.lane: GuardStore(
            client,
            prefix,
            spec.lane,
            ttl_ms=retry_path_ms(spec),
            hold_ms=parked_state_ms(spec),
            lease_ms=live_ms,
            live_ms=live_ms,
        )
        for spec in specs
    }
