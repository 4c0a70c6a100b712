"""Tell, while a member runs, that its Redis lost its data: held followers and buffers with it.

A follower held behind a parked key (an ordered lane with retry tiers) and a message waiting in
a debounce buffer have their offsets committed: Redis keeps their only copy. A Redis that comes
back empty (restarted without persistence, flushed) or with part of its data (restarted from a
snapshot older than its last writes, failed over to a replica that lagged) loses them, and
nothing else would say so: they simply never run.

The member keeps a marker under its key prefix (:func:`marker_key`), a hash without expiry:
a random epoch, written if missing (``HSETNX``; one already there, another member's, is
adopted), a count that every look adds one to (``HINCRBY``), and one field per group
(:func:`group_field`) that every look of its members writes if missing. It looks at start and
every :data:`CHECK_INTERVAL_S` (one transaction; never per message). The epoch gone
or changed, the Redis lost everything since the last look; the count not past the one seen
last, it went back to an older state of its data. Either way: one CRITICAL line (what was lost,
where its messages are, what to do) and ``pipeline_redis_state_lost_total`` counted once; the
look itself wrote the marker again. Every member using that Redis sees the same loss once: one
line and one count per member, each naming its own group. A Redis out of reach is skipped (the
runtime says so on its calls); one that refuses the marker (an ACL without it, a read-only
replica) is one warning line per run of refusals. A member whose lanes keep nothing only in
Redis watches nothing, but writes the marker at start all the same (:func:`mark_present`), so
that one of its lanes beginning to keep messages there is not taken for a loss.

A marker missing at start, or its group's field missing from it, is a first start of the
group, or a Redis that lost its data while no member of the group ran (every member stopped,
then the Redis flushed or restarted empty; a member of another group may have written the
marker again since), or a new or another Redis. The broker tells them apart: when the member's
lanes keep messages only in Redis, it is asked once whether the member's group has committed
offsets on their main topics (``Admin.group_lag``, bounded by :data:`CONSUMED_TIMEOUT_S`). It
has: one CRITICAL line and one count, by the first member of the group to start only (the
others find its field written). It has not (a first start): nothing; it did not answer in
time: a DEBUG line only. A group's field tells only on a marker written by this release with
every member since naming its group (:attr:`Look.tracked`): on one an earlier release wrote or
looked at (a member of it beside this release's, in a rolling update), a group's field may be
missing though nothing was lost, so nothing is asked until the marker is written anew (after
a loss). On the Redis
Streams transport it is not asked: the streams and the group's positions are in that same
Redis, so a Redis that lost the marker lost them too, and the broker can tell no more than the
marker (the member's start finds its topics missing).

A rollback to a state taken after this member's last look goes unseen by it (the members that
looked since see it). A Redis evicting under an ``allkeys-*`` policy may evict the marker, and
held followers and buffers with it: a loss found on a Redis that has evicted keys names the
eviction too (two ``INFO`` calls, at a loss only).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from pipeline.errors import PipelineError
from pipeline.observability.metrics import REDIS_STATE_LOST, Metrics
from pipeline.reachability import safe_url
from pipeline.redis_functions import FAILED
from pipeline.runtime.app import Lane
from pipeline.runtime.eviction import buffering_lanes, holding_lanes, kept_only_in_redis
from pipeline.transport.protocol import PartitionLag

__all__ = [
    "CHECK_INTERVAL_S",
    "CONSUMED_TIMEOUT_S",
    "RUNBOOK",
    "GroupPositions",
    "Look",
    "LossCounter",
    "StateLostCounter",
    "StateWatch",
    "group_field",
    "look",
    "mark_present",
    "marker_key",
]

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 5.0
"""Seconds between two reads of the marker: one Redis call each."""
CONSUMED_TIMEOUT_S = 5.0
"""Seconds the broker has at start to say whether the group consumed the lanes before."""
RUNBOOK = "docs/operations.md#redis-or-kafka-outage"
"""Where the CRITICAL line sends the operator."""


def marker_key(prefix: str) -> str:
    """The marker of the data of the Redis the members of key prefix ``prefix`` use (a hash).

    Hash-tagged as the pipeline's other keys (``{PREFIX:...}``), so an ACL granting those
    grants it.
    """
    return f"{{{prefix}:state}}:marker"


class GroupPositions(Protocol):
    """Where the group's committed offsets are read (a transport's :class:`Admin`)."""

    async def group_lag(self, group: str, topic: str) -> list[PartitionLag]:
        """The group's position, lag and oldest unconsumed timestamp per partition of ``topic``."""
        ...


class LossCounter(Protocol):
    """Where a loss is counted (:class:`StateLostCounter`)."""

    def lost(self) -> None:
        """Count one loss."""
        ...


class StateLostCounter:
    """``pipeline_redis_state_lost_total`` of one group, shown (0) from the member's start."""

    def __init__(self, metrics: Metrics, group: str) -> None:
        """Count into ``metrics``; the group's sample exists from now on."""
        self._counter = metrics.counter(REDIS_STATE_LOST).labels(group=group)

    def lost(self) -> None:
        """Count one loss."""
        self._counter.inc()


def _topics(lanes: Sequence[Lane]) -> str:
    return ", ".join(lane.spec.name for lane in lanes)


_EMPTIED = "restarted without persistence, flushed, or failed over to a replica without it"
_ROLLED_BACK = (
    "restarted from a snapshot older than its last writes, or failed over to a replica that lagged"
)


_PERSIST = "Run that Redis with appendonly yes and appendfsync everysec"
_NO_EVICTION = (
    "Run that Redis with maxmemory-policy noeviction, appendonly yes and appendfsync everysec"
)


def _recover(
    group: str, lanes: Sequence[Lane], *, marks_processed: bool, topics_in_redis: bool
) -> str:
    """Where the lost messages of ``lanes`` are, and who replays them (see :func:`lost_line`)."""
    topics = ", ".join(
        f"{what}: {_topics(chosen)}"
        for what, chosen in (("held", holding_lanes(lanes)), ("buffered", buffering_lanes(lanes)))
        if chosen
    )
    if topics_in_redis:
        names = ", ".join(dict.fromkeys(lane.spec.name for lane in lanes))
        sweeper = (
            "the ingress's sweeper replays those that came through it (their log rows were never"
            " marked processed), so replay none of them by hand"
            if marks_processed
            else "those that came through the ingress are in its log (pipeline replay)"
        )
        return (
            f"Group {group} committed their offsets, and their topics ({names}) were in this"
            f" Redis and went with it (PIPELINE_TRANSPORT=redis): {sweeper}; nothing else has"
            " the others"
        )
    if marks_processed:
        return (
            f"Group {group} committed their offsets: the ingress's sweeper replays those that"
            " came through it (their log rows were never marked processed), so replay none of"
            f" them by hand; the others are still in their topics ({topics}) below the group's"
            " positions, but nothing tells which"
        )
    return (
        f"Group {group} committed their offsets, so they are still in their topics"
        f" ({topics}) below the group's positions, but nothing tells which: find them there,"
        " or those that came through the ingress in its log (pipeline replay; with"
        " PIPELINE_RUNTIME__MARK_PROCESSED=true the ingress's sweeper replays them on its"
        " own)"
    )


def lost_line(
    url: str,
    group: str,
    lanes: Sequence[Lane],
    how: str,
    *,
    marks_processed: bool = False,
    topics_in_redis: bool = False,
    fix: str = _PERSIST,
) -> str:
    """The CRITICAL line for a loss found by the member of ``group`` on ``lanes``.

    ``how`` says what the marker showed and what that means; ``marks_processed``, whether the
    member marks its log rows processed (then the ingress's sweeper replays the webhooks among
    the lost messages); ``topics_in_redis``, whether the topics are streams in that same Redis
    (``PIPELINE_TRANSPORT=redis``: they went with it); ``fix``, how to run that Redis so that it
    loses nothing.
    """
    lost = " and ".join(kept_only_in_redis(lanes))
    recover = _recover(
        group, lanes, marks_processed=marks_processed, topics_in_redis=topics_in_redis
    )
    return (
        f"Redis {safe_url(url)} lost its data ({how}): the {lost} it had are"
        f" gone and will not run. {recover}; see {RUNBOOK}. {fix}. Every member using this Redis"
        " reports this once."
    )


def missing_line(
    url: str,
    key: str,
    group: str,
    lanes: Sequence[Lane],
    consumed: Sequence[str],
    *,
    evicting: str | None = None,
    marks_processed: bool = False,
    marker_missing: bool = True,
) -> str:
    """The CRITICAL line for ``group``'s field of marker ``key`` missing at start.

    ``consumed`` names the main topics the group has committed offsets on; ``evicting``, how
    the Redis evicts keys, if it has (:meth:`StateWatch._evicting`); ``marker_missing``,
    whether the whole marker was missing (else a member of another group wrote it again first).
    """
    lost = " and ".join(kept_only_in_redis(lanes))
    evicted = f", evicted it ({evicting})" if evicting else ""
    recover = _recover(group, lanes, marks_processed=marks_processed, topics_in_redis=False)
    fix = _NO_EVICTION if evicting else _PERSIST
    missing = (
        f"holds no state-loss marker {key}"
        if marker_missing
        else f"has no entry for group {group} in its state-loss marker {key} (a member of"
        " another group wrote the marker again since)"
    )
    return (
        f"Redis {safe_url(url)} {missing} although group {group} has"
        f" consumed {', '.join(consumed)} before (its offsets are committed): that Redis lost"
        f" its data while no member of group {group} ran ({_EMPTIED}){evicted}, or it is a new"
        f" or another Redis than the one the group's members used (PIPELINE_REDIS__URL)."
        f" The {lost} it had may be gone and will not run. {recover}; see {RUNBOOK}. {fix}."
        f" Only the first member of group {group} to start reports this."
    )


class StateWatch:
    """The marker of one member's Redis: written at :meth:`start`, looked at by :meth:`check`."""

    def __init__(
        self,
        redis: Redis,
        url: str,
        prefix: str,
        group: str,
        lanes: Sequence[Lane],
        counter: LossCounter | None = None,
        *,
        marks_processed: bool = False,
        topics_in_redis: bool = False,
        interval_s: float = CHECK_INTERVAL_S,
        admin: GroupPositions | None = None,
        consumed_timeout_s: float = CONSUMED_TIMEOUT_S,
    ) -> None:
        """Watch the Redis at ``url`` (``redis``) for the member of ``group`` running ``lanes``.

        ``marks_processed``: the member marks its log rows processed; ``topics_in_redis``: its
        topics are streams in that Redis (both said in the line). ``admin``: the broker asked,
        within ``consumed_timeout_s``, whether the group consumed the lanes before, when the
        marker is missing at start (None, or ``topics_in_redis``: not asked).
        """
        self._redis = redis
        self._url = url
        self._key = marker_key(prefix)
        self.group = group
        """The member's consumer group, named in the CRITICAL line."""
        self._lanes = list(lanes)
        self._counter = counter
        self._uncounted = 0
        """Losses found before there was a counter (at start), counted once it is set."""
        self._admin = None if topics_in_redis else admin
        self._consumed_timeout_s = consumed_timeout_s
        self._marks_processed = marks_processed
        self._topics_in_redis = topics_in_redis
        self._interval_s = interval_s
        self._epoch: bytes | None = None
        """The marker's epoch as last seen; None until it could be read."""
        self._count = 0
        """The marker's count as last seen."""
        self._refused = False
        """Whether the last look was refused (warned once)."""

    @property
    def key(self) -> str:
        """The marker's key."""
        return self._key

    @property
    def counter(self) -> LossCounter | None:
        """Where a loss is counted (None: nowhere yet; set once the member's metrics exist)."""
        return self._counter

    @counter.setter
    def counter(self, counter: LossCounter | None) -> None:
        """Count into ``counter`` from now on, and the losses found before it was set."""
        self._counter = counter
        while counter is not None and self._uncounted:
            self._uncounted -= 1
            counter.lost()

    def _lost(self) -> None:
        """Count one loss, now or once there is a counter."""
        if self._counter is None:
            self._uncounted += 1
        else:
            self._counter.lost()

    async def start(self) -> bool:
        """Write the marker unless it is there (another member's: adopted); True if a loss.

        Quiet when Redis is out of reach; a refusal is one warning (:meth:`_failed`). A marker,
        or the group's field in a tracked one (:attr:`Look.tracked`), missing while the group
        has consumed its lanes before is a loss (:meth:`_consumed`): logged (CRITICAL) and
        counted.
        """
        admin, self._admin = self._admin, None  # asked at this start only: the client is let go
        try:
            found = await look(self._redis, self._key, self.group)
        except FAILED as exc:
            self._failed(exc)
            return False
        self._refused = False
        self._epoch, self._count = found.epoch, found.count
        # The group's field missing from a marker that keeps every group's: no member of the
        # group looked since the marker was written (after a loss, or on a new Redis).
        if not (found.first_of_group and found.tracked):
            return False
        if not (consumed := await self._consumed(admin)):
            return False
        line = missing_line(
            self._url,
            self._key,
            self.group,
            self._lanes,
            consumed,
            evicting=await self._evicting(),
            marks_processed=self._marks_processed,
            marker_missing=found.written,
        )
        log.critical(line)
        self._lost()
        return True

    async def _consumed(self, admin: GroupPositions | None) -> list[str]:
        """The main topics of the lanes keeping messages in Redis the group committed on.

        One ``admin.group_lag`` a topic, all at once, within ``consumed_timeout_s``; empty when
        not asked (no ``admin``), when none (a first start), or when the broker did not answer
        (DEBUG).
        """
        lanes = [*holding_lanes(self._lanes), *buffering_lanes(self._lanes)]
        topics = list(dict.fromkeys(lane.spec.name for lane in lanes))
        if admin is None or not topics:
            return []
        try:
            async with asyncio.timeout(self._consumed_timeout_s):
                lags = await asyncio.gather(*(admin.group_lag(self.group, t) for t in topics))
        except (PipelineError, TimeoutError) as exc:
            log.debug(
                "marker %s missing at start, and the broker did not say whether group %s"
                " consumed %s before (%s): a loss of Redis %s while no member ran goes unseen",
                self._key,
                self.group,
                ", ".join(topics),
                str(exc) or f"no answer within {self._consumed_timeout_s:g}s",
                safe_url(self._url),
            )
            return []
        return [
            topic
            for topic, lag in zip(topics, lags, strict=True)
            if any((p.committed or 0) > 0 for p in lag)
        ]

    def _failed(self, exc: BaseException) -> None:
        """One warning for the first of a run of refusals; DEBUG for the rest and for no answer.

        Redis out of reach says so on the member's own calls; a refusal (an ACL without the
        marker's key or commands, a read-only replica) is this watch's alone, and while it lasts
        a loss goes unseen.
        """
        url = safe_url(self._url)
        if not isinstance(exc, ResponseError) or self._refused:
            log.debug("could not look at the marker %s of Redis %s: %s", self._key, url, exc)
            return
        self._refused = True
        log.warning(
            "Redis %s refused the state-loss marker %s (%s): until it takes it, a loss of its"
            " data (and of the held followers and buffered messages in it) goes unseen; grant"
            " the member's user HSETNX, HINCRBY, HGET, MULTI and EXEC on that key, or point"
            " PIPELINE_REDIS__URL at the primary",
            url,
            self._key,
            exc,
        )

    async def check(self) -> bool:
        """Look at the marker once; True if the Redis lost its data since the last look.

        A loss is logged (CRITICAL) and counted; the look wrote the marker again.
        """
        try:
            found = await look(self._redis, self._key, self.group)
        except FAILED as exc:
            self._failed(exc)
            return False
        self._refused = False
        written, epoch, count = found.written, found.epoch, found.count
        seen, last = self._epoch, self._count
        if seen is None or (epoch == seen and count > last):
            self._epoch, self._count = epoch, count
            return False
        fix = _PERSIST
        if epoch != seen:
            how = f"marker {self._key} {'gone' if written else 'changed'}: {_EMPTIED}"
            if evicting := await self._evicting():
                how = f"{how}, or evicted: {evicting}"
                fix = _NO_EVICTION
            if written:  # nothing but the marker tells; a deletion of it alone is told apart
                how = f"{how}; unless someone deleted that key alone: then none is lost"
        else:
            went = f"went back from {last} to {count - 1}"
            how = f"marker {self._key}'s count {went}: {_ROLLED_BACK}"
        line = lost_line(
            self._url,
            self.group,
            self._lanes,
            how,
            marks_processed=self._marks_processed,
            topics_in_redis=self._topics_in_redis,
            fix=fix,
        )
        log.critical(line)
        self._lost()
        self._epoch, self._count = epoch, count  # seen once reported: a failure before, again
        return True

    async def _evicting(self) -> str | None:
        """How this Redis evicts keys, if it has evicted any since it started (else None).

        Two ``INFO`` calls, made only once a loss is found; None when refused.
        """
        try:
            memory = await self._redis.info("memory")
            stats = await self._redis.info("stats")
        except FAILED:
            return None
        policy, evicted = str(memory.get("maxmemory_policy", "")), stats.get("evicted_keys", 0)
        if not policy.startswith("allkeys-") or not isinstance(evicted, int) or evicted < 1:
            return None
        return f"it has evicted {evicted} keys under maxmemory-policy {policy}"

    async def run(self, stop: asyncio.Event) -> None:
        """:meth:`check` every interval until ``stop`` is set.

        A look failing unforeseen (not Redis out of reach or refusing) does not end the watch:
        the first of a run of them is one ERROR line with its traceback, and it looks again.
        """
        broken = False
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)
            if stop.is_set():
                return
            try:
                await self.check()
            except Exception:
                (log.debug if broken else log.exception)(
                    "could not look at the state-loss marker %s of Redis %s (it looks again"
                    " every %gs; until it can, a loss of its data goes unseen): please report it",
                    self._key,
                    safe_url(self._url),
                    self._interval_s,
                    exc_info=True,
                )
                broken = True
            else:
                broken = False


EPOCH_FIELD = "epoch"
"""The marker's random epoch, written when the marker is missing."""
COUNT_FIELD = "count"
"""The marker's count of looks."""
NAMED_FIELD = "named"
"""The marker's count of looks by members that wrote their group's field: equal to its count
only when every look since the marker was written named its group (none by a member of an
earlier release, which raises the count alone, or by one that named no group)."""


def group_field(group: str) -> str:
    """The marker's field of ``group``: written by each look of its members."""
    return f"group:{group}"


@dataclass(frozen=True, slots=True)
class Look:
    """What one look at the marker found (:func:`look`)."""

    written: bool
    """Whether this look wrote the epoch: the marker was missing."""
    epoch: bytes | None
    """The marker's epoch."""
    count: int
    """The marker's count, this look's included."""
    first_of_group: bool
    """Whether this look wrote its group's field: no member of it looked since the marker was
    written."""
    tracked: bool
    """Whether every member that looked since the marker was written wrote its group's field
    (a marker an earlier release wrote or looked at, or a member that named no group, keeps it
    False)."""


def _text(value: object) -> bytes | None:
    if isinstance(value, str):
        return value.encode()
    return value if isinstance(value, bytes) else None


async def look(redis: Redis, key: str, group: str | None) -> Look:
    """Count one look at marker ``key`` by a member of ``group`` (its epoch written if missing).

    One transaction: the epoch written if missing, then the group's field, the count and the
    count of looks naming their group raised (``group`` None: the count alone, so the marker is
    left untracked), and the epoch read back. A member of an earlier release raises the count
    alone too: the marker it wrote, or looked at since, is untracked.
    """
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hsetnx(key, EPOCH_FIELD, secrets.token_hex(8))
        if group is not None:
            pipe.hsetnx(key, group_field(group), 1)
            pipe.hincrby(key, NAMED_FIELD, 1)
        pipe.hincrby(key, COUNT_FIELD, 1)
        pipe.hget(key, EPOCH_FIELD)
        written, *named, count, epoch = await pipe.execute()
    epoch = _text(epoch)
    return Look(
        written=bool(written),
        epoch=epoch,
        count=int(count),
        first_of_group=bool(named) and bool(named[0]),
        tracked=epoch is not None and bool(named) and int(named[1]) == int(count),
    )


async def mark_present(redis: Redis, url: str, prefix: str, group: str | None = None) -> None:
    """Write the marker of key prefix ``prefix`` if missing, for a member that keeps no watch.

    A member whose lanes keep nothing only in Redis watches nothing, but its group commits
    offsets: without a marker (and its ``group``'s field in it), the first start after one of
    its lanes began keeping held followers or debounce buffers (``retry:`` on an ordered lane,
    ``debounce:``) would take the missing marker for a loss. Without ``group`` the marker is
    left untracked (:attr:`Look.tracked`): no group's missing field is taken for a loss until
    it is written anew. One transaction at start; a Redis out of reach or refusing it is a
    DEBUG line (the runtime's own calls say so).
    """
    try:
        await look(redis, marker_key(prefix), group)
    except FAILED as exc:
        log.debug("state marker not written at %s: %s", safe_url(url), exc)
