"""A Redis Streams consumer-group member that owns whole partitions through leases.

Every topic partition is one stream. Members of a group share the partitions round-robin; a
partition belongs to one member at a time through a lease in ``{P:g:G}:owners`` renewed by a
heartbeat (``pl_heartbeat``), so per-key order holds with several members. Hand-over is
cooperative: when a member joins, the current owner is asked to release the partitions that move,
revokes them through the listener (which may commit) and releases them; the new owner claims them
at its next heartbeat. A member that dies stops renewing; after ``lease_ms`` its partitions go to
the others, which first reclaim its pending entries in id order (``XAUTOCLAIM``), then delete
the former owners' consumers, now holding nothing, from the stream's group
(``pl_forget_consumers``: members that come and go leave nothing behind), before reading new
ones. Heartbeats
are jittered, and the lease spans many heartbeats, so one slow tick never moves a partition away
from a live member. A partition whose stream key is in a bad state (another type, its group or
the stream gone) is set aside, one line naming its key, and taken up again on its own, while
the member's other partitions read on (:mod:`pipeline.transport.redis_streams.broken`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline.config import RedisSettings
from pipeline.envelope import Message, Position, TopicPartition
from pipeline.errors import TransportError, UnknownTopic
from pipeline.transport.protocol import RebalanceListener, StartAt
from pipeline.transport.redis_streams.admin import (
    UnreadableTopicMeta,
    decode_meta,
    read_meta,
    timestamp_of,
)
from pipeline.transport.redis_streams.broken import Broken, line, per_key, probe, repeat_key
from pipeline.transport.redis_streams.errors import translate
from pipeline.transport.redis_streams.functions import Functions
from pipeline.transport.redis_streams.keys import (
    Keys,
    entry_id,
    offset_of,
    parse_partition_id,
    partition_id,
)
from pipeline.transport.redis_streams.lost import lost_or_deleted, vanished
from pipeline.transport.retention import report_lost

log = logging.getLogger(__name__)
_PAUSED_BLOCK_MS = 50
"""Longest blocking read while some owned partition is paused (it resumes on the next read)."""


def decode_entry(
    tp: TopicPartition, entry_id_raw: bytes, fields: dict[bytes, bytes], delivery_count: int = 1
) -> Message:
    r"""Build a :class:`Message` from one stream entry.

    Any client can ``XADD`` to a topic's stream: a header name that is not UTF-8 comes with its
    bytes escaped (``\xff``), and a ``t`` that is no whole number reads as 0, as a missing one
    does, so such an entry is delivered instead of failing every poll of its partition.
    """
    headers = {
        k[2:].decode(errors="backslashreplace"): v for k, v in fields.items() if k.startswith(b"h.")
    }
    return Message(
        topic=tp.topic,
        partition=tp.partition,
        offset=offset_of(entry_id_raw),
        key=fields.get(b"k"),
        value=fields.get(b"v", b""),
        headers=headers,
        timestamp_ms=timestamp_of(fields.get(b"t")),
        delivery_count=delivery_count,
    )


class RedisStreamsConsumer:
    """A :class:`~pipeline.transport.protocol.Consumer` on Redis Streams."""

    def __init__(
        self,
        client: Redis,
        keys: Keys,
        functions: Functions,
        settings: RedisSettings,
        group: str,
        topics: Sequence[str],
        *,
        listener: RebalanceListener | None = None,
        member_id: str | None = None,
        start_at: StartAt = "earliest",
        hold_on_close: bool = False,
    ) -> None:
        """Create the member; it joins the group on the first poll.

        A ``member_id`` that a restarted member reuses gets its own unexpired leases back at
        once and reclaims its pending entries in order. With ``hold_on_close``, :meth:`close`
        keeps the leases (they expire ``lease_ms`` after the last heartbeat) for such a
        replacement instead of handing the partitions to the other members.
        """
        self.member_id = member_id or uuid.uuid4().hex[:12]
        self._hold_on_close = hold_on_close
        self._client = client
        self._keys = keys
        self._functions = functions
        self._settings = settings
        self._group = group
        self._topics = list(topics)
        self._listener = listener
        self._start_id = "0" if start_at == "earliest" else "$"
        self._partition_ids: list[str] = []
        self._owned: set[TopicPartition] = set()
        self._paused: set[TopicPartition] = set()
        self._reclaim: dict[TopicPartition, str] = {}  # partition -> XAUTOCLAIM cursor
        # (offset, entry id) delivered and not acknowledged: entries another client XADDed
        # within one millisecond share an offset, so each is acknowledged by its own id.
        self._unacked: dict[TopicPartition, deque[tuple[int, bytes]]] = {}
        self._delivered: dict[TopicPartition, int] = {}  # one past the last offset returned
        # One past the group's last-delivered id: where XREADGROUP's next entry should be. An
        # entry read above it, with the stream now starting above it too, means MAXLEN trimmed
        # the entries in between before the group read them.
        self._next_new: dict[TopicPartition, int] = {}
        # Leased partitions whose stream key is in a bad state: left out of reads, each taken
        # up again on its own when due (pipeline/transport/redis_streams/broken.py).
        self._broken: dict[TopicPartition, Broken] = {}
        self._target_owned: set[TopicPartition] = set()
        self._to_release: set[TopicPartition] = set()
        self._changed = asyncio.Event()
        self._resumed = asyncio.Event()
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._last_renewed = 0.0
        self._rejoining = False
        self._closed = False

    # -- membership -------------------------------------------------------------------------

    async def _start(self) -> None:
        counts = []
        for topic in self._topics:
            meta = await read_meta(self._client, self._keys, topic, self._settings.max_len)
            counts.append(meta.partitions)
        self._partition_ids = _partition_ids(self._topics, counts)
        await self._heartbeat()
        self._heartbeat_task = asyncio.create_task(self._heartbeat_forever())

    async def _heartbeat(self) -> None:
        owned, release = await self._functions.heartbeat(
            self._keys.members(self._group),
            self._keys.owners(self._group),
            self.member_id,
            self._settings.lease_ms,
            self._partition_ids,
        )
        self._last_renewed = time.monotonic()
        target = {TopicPartition(*parse_partition_id(p)) for p in owned}
        to_release = {TopicPartition(*parse_partition_id(p)) for p in release}
        if target != self._target_owned or to_release != self._to_release:
            self._target_owned, self._to_release = target, to_release
            self._changed.set()

    async def _refresh_partitions(self) -> None:
        """Share the partitions the topics have now: ``pipeline topics apply`` may add some.

        One ``HMGET`` of the topics' metadata. While a topic is missing (deleted) or its
        metadata cannot be read (a hand edit, another program), the partitions known before are
        kept; the latter is a warning naming the topic and the field, its repeats backed off by
        the log filter (:mod:`pipeline.log_repeats`).
        """
        raw: list[Any] = await self._client.hmget(self._keys.topics, self._topics)
        if None in raw:
            return
        counts = []
        for topic, value in zip(self._topics, raw, strict=True):
            try:
                counts.append(
                    decode_meta(value, self._settings.max_len, topic, self._keys).partitions
                )
            except UnreadableTopicMeta as exc:
                log.warning(
                    "%s: %s; the member keeps the partitions it knew until it is fixed",
                    self.member_id,
                    exc,
                )
                return
        self._partition_ids = _partition_ids(self._topics, counts)

    def _renewal_age_s(self) -> float:
        """Seconds since the leases were last renewed."""
        return time.monotonic() - self._last_renewed

    def _stalled(self) -> bool:
        """Whether the last lease renewal is older than half a lease (heartbeats are far apart)."""
        return self._renewal_age_s() > self._settings.lease_ms / 2000

    async def _heartbeat_forever(self) -> None:
        interval_s = self._settings.heartbeat_ms / 1000
        lease_s = self._settings.lease_ms / 1000
        while not self._closed:
            await asyncio.sleep(interval_s * random.uniform(0.8, 1.2))  # jitter spreads renewals
            with contextlib.suppress(rexc.RedisError, OSError):  # the heartbeat says what failed
                await self._refresh_partitions()
            try:
                await self._heartbeat()
            except (rexc.RedisError, OSError) as exc:
                log.warning("heartbeat of %s failed: %s", self.member_id, exc)
                if self._renewal_age_s() > lease_s and self._target_owned:
                    # Our leases have expired: the partitions may already be someone else's.
                    self._target_owned = set()
                    self._changed.set()

    async def _apply_changes(self) -> None:
        """Run rebalance callbacks for what the last heartbeat decided (inside poll)."""
        self._changed.clear()
        lost = set(self._owned) if self._rejoining else self._owned - self._target_owned
        self._rejoining = False
        releasing = self._owned & self._to_release
        gone = lost | releasing
        if gone:
            if self._listener:
                if lost - releasing:
                    await self._listener.on_revoked(sorted(lost - releasing), lost=True)
                if releasing:
                    await self.commit(
                        await self._listener.on_revoked(sorted(releasing), lost=False)
                    )
            self._owned -= gone
            for tp in gone:
                self._forget(tp)
        # A heartbeat may claim a dead member's partition for us and, before we took it up, a
        # joining member becomes its target: we never owned it here, but its lease is ours.
        # Give it up with the rest, or we would renew it forever and strand it.
        unclaimed = self._to_release - self._owned - gone
        if releasing or unclaimed:
            await self._functions.release(
                self._keys.members(self._group),
                self._keys.owners(self._group),
                self.member_id,
                [partition_id(tp.topic, tp.partition) for tp in sorted(releasing | unclaimed)],
                leave=False,
            )
        await self._take_up(self._target_owned - self._to_release)

    async def _take_up(self, mine: set[TopicPartition]) -> None:
        """Assign the partitions of ``mine`` not owned yet, but set-aside ones not yet due."""
        now = time.monotonic()
        self._broken = {tp: b for tp, b in self._broken.items() if tp in mine}
        waiting = {tp for tp, broken in self._broken.items() if not broken.due(now)}
        new = {tp for tp in sorted(mine - self._owned - waiting) if await self._group_ready(tp)}
        if not new:
            return
        for tp in new:
            self._reclaim[tp] = "0-0"
            self._unacked[tp] = deque()
            self._paused.discard(tp)  # a new assignment starts flowing
        self._owned |= new
        if self._listener:
            await self._listener.on_assigned(sorted(new), await self.committed(sorted(new)))

    async def _group_ready(self, tp: TopicPartition) -> bool:
        """:meth:`_ensure_group`; False, with the partition set aside, where its key is bad.

        A stream key of another type cannot hold the group: the partition waits, tried again
        with backoff, its line's repeats backed off, while the member's others are taken up.
        """
        try:
            await self._ensure_group(tp)
        except rexc.ResponseError as exc:
            if not per_key(exc):
                raise
            broken = self._broken.get(tp)
            if broken is None:
                broken = self._broken[tp] = Broken.found("wrong_type")
            broken.failed_again("wrong_type")
            self._say_broken(tp, broken)
            return False
        if self._broken.pop(tp, None) is not None:
            log.info(
                "%s of %s: partition %s[%d] is read again",
                self.member_id,
                self._group,
                tp.topic,
                tp.partition,
            )
        return True

    async def _ensure_group(self, tp: TopicPartition) -> None:
        """Create the group on the partition's stream, or note where the existing one reads."""
        try:
            await self._client.xgroup_create(
                self._keys.stream(tp.topic, tp.partition),
                self._group,
                id=self._start_id,
                mkstream=True,
            )
        except rexc.ResponseError as exc:
            if not str(exc).startswith("BUSYGROUP"):
                raise  # WRONGTYPE: the key holds something else
            await self._read_last_delivered(tp)  # the group exists already

    async def _read_last_delivered(self, tp: TopicPartition) -> None:
        """Note where the group's next new entry of ``tp`` should be (``XINFO GROUPS``)."""
        groups: list[dict[str, Any]] = await self._client.xinfo_groups(
            self._keys.stream(tp.topic, tp.partition)
        )
        for group in groups:
            name = group["name"]
            if (name.decode() if isinstance(name, bytes) else name) == self._group:
                self._next_new[tp] = offset_of(group["last-delivered-id"]) + 1

    async def _report_trimmed(self, tp: TopicPartition, stream: str, read: int) -> None:
        """Entries read from ``read`` on, above the next one expected: were those between trimmed?

        They were when the stream now starts above the expected offset (an entry another
        client appended with an auto id leaves unused offsets below it, never trimmed ones).
        """
        expected = self._next_new.get(tp)
        if expected is None or read <= expected:
            return
        held: Any = await self._client.xrange(stream, count=1)
        start = offset_of(held[0][0]) if held else read
        report_lost(self._group, tp, expected, min(start, read), transport="redis")

    # -- fetching -----------------------------------------------------------------------------

    async def poll(self, max_messages: int = 500, timeout_s: float = 1.0) -> list[Message]:
        """Reclaimed entries of a previous owner first (in order), then new entries."""
        try:
            out = await self._fetch(max_messages, timeout_s)
        except rexc.ResponseError as exc:
            try:
                if per_key(exc) and await self._set_aside_broken(exc):
                    return []  # the next poll reads the others
            except rexc.RedisError as again:
                raise translate(again, f"consume {self._topics}") from exc
            if not vanished(exc):
                raise translate(exc, f"consume {self._topics}") from exc
            await self._take_up_again(exc)
            return []
        except rexc.RedisError as exc:
            raise translate(exc, f"consume {self._topics}") from exc
        for msg in out:
            self._delivered[msg.tp] = msg.offset + 1
        return out

    async def _fetch(self, max_messages: int, timeout_s: float) -> list[Message]:
        if self._heartbeat_task is None:
            await self._start()
        elif self._owned and self._stalled():
            # Stalled past half a lease (a frozen process, a long pause of the loop): the
            # leases may be another member's by now. Read nothing before finding out, or
            # new entries of a taken partition would go to this member's pending list,
            # where the new owner, past its take-over, never looks.
            await self._heartbeat()
        if self._broken and any(b.due(time.monotonic()) for b in self._broken.values()):
            self._changed.set()  # a set-aside partition is due to be taken up again
        if self._changed.is_set():
            try:
                await self._apply_changes()
            except BaseException:
                self._changed.set()  # not applied: the next poll tries again
                raise
        try:
            out = await self._reclaim_some(max_messages)
            if not out:
                out = await self._read_new(max_messages, timeout_s)
        except BaseException:
            self._claim_undelivered_again()
            self._next_new.clear()  # a failed read may have moved the group past entries
            raise
        return out

    async def _set_aside_broken(self, error: rexc.ResponseError) -> bool:
        """After a read failed on a key (``error``): set aside the partitions whose key is bad.

        Each is revoked as lost (its entries may be gone, its pending list with them) and left
        out of reads, one line each; it is taken up again on its own (:meth:`_apply_changes`):
        at once where the member makes the stream or its group again itself, with backoff while
        its key holds another type. False when no owned partition's key is bad (a whole topic
        deleted, a key repaired meanwhile): the caller handles the error as before. A missing
        stream or group of a topic deleted raises :class:`UnknownTopic` as before.
        """
        found = await probe(self._client, self._keys, self._group, self._owned)
        if not found:
            return False
        if any(state != "wrong_type" for state in found.values()):
            await self._topics_still_there(error)
        gone = sorted(found)
        if self._listener:
            await self._listener.on_revoked(gone, lost=True)
        for tp in gone:
            self._forget(tp)
            self._owned.discard(tp)
            broken = self._broken[tp] = Broken.found(found[tp])
            self._say_broken(tp, broken)
        self._changed.set()
        return True

    def _say_broken(self, tp: TopicPartition, broken: Broken) -> None:
        """The partition's line; its repeats in the same state backed off by the log filter."""
        stream = self._keys.stream(tp.topic, tp.partition)
        log.warning(
            "%s",
            line(self.member_id, self._group, tp, stream, broken),
            extra=repeat_key(self._group, tp, broken),
        )

    def _forget(self, tp: TopicPartition) -> None:
        """Drop what this member noted about ``tp`` (revoked, or set aside)."""
        self._unacked.pop(tp, None)
        self._delivered.pop(tp, None)
        self._next_new.pop(tp, None)
        self._reclaim.pop(tp, None)
        self._paused.discard(tp)

    async def _topics_still_there(self, error: rexc.ResponseError) -> None:
        """Raise :class:`UnknownTopic` where a topic read is gone (deleted, or Redis lost it)."""
        for topic in self._topics:
            try:
                await read_meta(self._client, self._keys, topic, self._settings.max_len)
            except UnknownTopic as missing:
                raise await lost_or_deleted(
                    self._client,
                    self._keys,
                    self._settings.url,
                    self._group,
                    self._topics,
                    missing,
                ) from error

    async def _take_up_again(self, error: rexc.ResponseError) -> None:
        """A stream or its group is gone (the topic deleted and created again, the group deleted).

        Every partition is revoked as lost and taken up again at the next poll, its group made
        anew on the stream and read from the positions committed since (none for a topic
        created again: offset 0), as a Kafka member takes a recreated topic up. A topic deleted
        and not created again raises :class:`UnknownTopic`, as on Kafka; one gone with every
        other topic, in a Redis that lost its data, raises it with a line saying so
        (:mod:`pipeline.transport.redis_streams.lost`).
        """
        await self._topics_still_there(error)
        log.warning(
            "%s of %s: %s; taking its partitions up again", self.member_id, self._group, error
        )
        self._rejoining = True
        self._changed.set()

    def _claim_undelivered_again(self) -> None:
        """After a failed read, claim what it may have taken before anything new is read.

        ``XREADGROUP`` and ``XAUTOCLAIM`` move entries into this member's pending list on the
        server whether or not their reply arrives (a connection cut, a reply later than the
        socket timeout). Read past them, they would stay pending and never be delivered while
        later commits moved the position over them. So every owned partition claims its
        pending entries again from the first offset not returned (``XAUTOCLAIM``, in order),
        as a new owner does, and forgets what the failed poll noted but never returned.
        """
        for tp in self._owned:
            start = self._delivered.get(tp)
            self._reclaim[tp] = "0-0" if start is None else entry_id(start)
            pending = self._unacked.get(tp, ())
            self._unacked[tp] = deque(e for e in pending if start is not None and e[0] < start)

    async def _reclaim_some(self, max_messages: int) -> list[Message]:
        out: list[Message] = []
        for tp in sorted(self._reclaim):
            if tp in self._paused or len(out) >= max_messages:
                continue
            stream = self._keys.stream(tp.topic, tp.partition)
            cursor, entries, *deleted = await self._client.xautoclaim(
                stream,
                self._group,
                self.member_id,
                min_idle_time=0,
                start_id=self._reclaim[tp],
                count=max_messages - len(out),
            )
            cursor = cursor.decode() if isinstance(cursor, bytes) else cursor
            if cursor == "0-0":  # every former owner's entry is this member's now
                del self._reclaim[tp]
                await self._functions.forget_consumers(stream, self._group, self.member_id)
            else:
                self._reclaim[tp] = cursor
            # Pending entries trimmed before this member claimed them (Redis drops them from
            # the pending list and names them): delivered once, never finished, now gone.
            for first, end in _runs(sorted(offset_of(eid) for eid in (deleted or [[]])[0])):
                report_lost(self._group, tp, first, end, transport="redis")
            live = [(eid, fields) for eid, fields in entries if fields]
            if not live:
                continue
            counts = await self._delivery_counts(stream, live[0][0], live[-1][0], len(live))
            for eid, fields in live:
                msg = decode_entry(tp, eid, fields, counts.get(eid, 1))
                self._unacked[tp].append((msg.offset, eid))
                out.append(msg)
        return out

    async def _delivery_counts(
        self, stream: str, first: bytes, last: bytes, n: int
    ) -> dict[bytes, int]:
        """Delivery counts from the pending entries list (``XPENDING`` extended form)."""
        rows: Any = await self._client.xpending_range(
            stream, self._group, min=first, max=last, count=n
        )
        return {row["message_id"]: int(row["times_delivered"]) for row in rows}

    async def _read_new(self, max_messages: int, timeout_s: float) -> list[Message]:
        active = sorted(self._owned - self._paused - set(self._reclaim))
        if not active:
            self._resumed.clear()
            waits = [asyncio.ensure_future(e.wait()) for e in (self._changed, self._resumed)]
            _, pending = await asyncio.wait(
                waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending:
                task.cancel()
            return []
        block_ms = max(1, int(min(timeout_s, self._settings.socket_timeout_s / 2) * 1000))
        if self._paused & self._owned:
            # A paused partition resumes only with the next read: keep this one short, as a
            # Kafka member's fetch.wait.max.ms does, so backpressure does not idle the member.
            block_ms = min(block_ms, _PAUSED_BLOCK_MS)
        streams: dict[Any, Any] = {self._keys.stream(tp.topic, tp.partition): ">" for tp in active}
        by_stream = {self._keys.stream(tp.topic, tp.partition): tp for tp in active}
        reply: Any = await self._client.xreadgroup(
            self._group,
            self.member_id,
            streams,
            count=max(1, max_messages // len(active)),
            block=block_ms,
        )
        out: list[Message] = []
        for stream_raw, entries in reply or []:
            tp = by_stream[stream_raw.decode()]
            if not entries:
                continue
            await self._report_trimmed(tp, stream_raw.decode(), offset_of(entries[0][0]))
            self._next_new[tp] = offset_of(entries[-1][0]) + 1
            for eid, fields in entries:
                msg = decode_entry(tp, eid, fields)
                self._unacked.setdefault(tp, deque()).append((msg.offset, eid))
                out.append(msg)
        return out

    # -- positions ----------------------------------------------------------------------------

    async def commit(self, positions: Sequence[Position]) -> None:
        """Record each position, then XACK every delivered entry below it.

        Only where this member still holds the partition's lease (``pl_commit``): a member
        stalled while another took the partition over must neither move its position back
        nor acknowledge entries the new owner has yet to run. Such partitions are revoked as
        lost at the next poll.
        """
        if not positions:
            return
        try:
            refused = await self._functions.commit(
                self._keys.owners(self._group),
                self._keys.positions(self._group),
                self.member_id,
                [
                    (partition_id(p.tp.topic, p.tp.partition), p.offset, p.metadata)
                    for p in positions
                ],
            )
            taken = {TopicPartition(*parse_partition_id(pid)) for pid in refused}
            pipe = self._client.pipeline(transaction=False)
            for pos in positions:
                pending = self._unacked.get(pos.tp, deque())
                ids = []
                while pending and pending[0][0] < pos.offset:
                    ids.append(pending.popleft()[1])
                if ids and pos.tp not in taken:
                    pipe.xack(self._keys.stream(pos.tp.topic, pos.tp.partition), self._group, *ids)
            await pipe.execute()
        except rexc.RedisError as exc:
            raise translate(exc, "commit") from exc
        if taken:
            log.warning(
                "%s: %s taken over by another member; not committed, revoked as lost",
                self.member_id,
                sorted(f"{tp.topic}[{tp.partition}]" for tp in taken),
            )
            self._target_owned -= taken
            self._changed.set()

    async def committed(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, Position]:
        """The group's stored positions with their metadata (``HMGET`` of ``{P:g:G}:pos``)."""
        fields = []
        for tp in partitions:
            field = partition_id(tp.topic, tp.partition)
            fields += [field, f"{field}:meta"]
        if not fields:
            return {}
        try:
            values: list[Any] = await self._client.hmget(self._keys.positions(self._group), fields)
        except rexc.RedisError as exc:
            raise translate(exc, "committed") from exc
        out = {}
        for i, tp in enumerate(partitions):
            offset, meta = values[2 * i], values[2 * i + 1]
            if offset is not None:
                out[tp] = Position(tp, int(offset), (meta or b"").decode())
        return out

    def pause(self, partitions: Sequence[TopicPartition]) -> None:
        """Stop fetching these partitions."""
        self._paused.update(partitions)

    def resume(self, partitions: Sequence[TopicPartition]) -> None:
        """Fetch again from these partitions (a poll waiting with all of them paused wakes)."""
        self._paused.difference_update(partitions)
        self._resumed.set()

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member owns now."""
        return set(self._owned)

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Move the group's read position of ``tp`` (``XGROUP SETID``) to ``offset``."""
        try:
            await self._client.xgroup_setid(
                self._keys.stream(tp.topic, tp.partition), self._group, f"{offset}-0"
            )
        except rexc.RedisError as exc:
            raise translate(exc, f"seek {tp}") from exc
        pending = self._unacked.get(tp)
        if pending is not None:
            self._unacked[tp] = deque(e for e in pending if e[0] < offset)
        self._delivered[tp] = offset
        self._next_new[tp] = offset
        self._reclaim.pop(tp, None)

    async def rejoin(self) -> None:
        """At the next poll, revoke every partition as lost and take up what the leases give.

        The leases are renewed (or found taken) now. A partition whose lease is still this
        member's is assigned again at once and read from its pending entries on, like one
        taken up after a crash; one whose lease another member holds stays revoked.
        """
        if self._heartbeat_task is None or self._closed:
            return  # not joined yet: the first poll asks
        self._rejoining = True
        self._changed.set()
        try:
            await self._heartbeat()
        except rexc.RedisError as exc:
            raise translate(exc, f"rejoin {self._group!r}") from exc

    async def close(self) -> None:
        """Revoke owned partitions through the listener, then release them and leave the group.

        With ``hold_on_close`` the partitions stay leased to this member's name until the
        leases expire, so a replacement of the same name takes them back without a move.
        """
        if self._closed:
            return
        self._closed = True
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat_task
        owned = sorted(self._owned)
        if owned and self._listener:
            try:
                await self.commit(await self._listener.on_revoked(owned, lost=False))
            except (TransportError, rexc.RedisError, OSError) as exc:
                log.warning(
                    "%s: final commit failed, its uncommitted work runs again: %s",
                    self.member_id,
                    exc,
                )
        self._owned.clear()
        owned += sorted(self._broken)  # set aside, still leased to this member
        if self._hold_on_close:
            return  # the leases run out on their own unless a member of the same name renews them
        with contextlib.suppress(rexc.RedisError, OSError):
            await self._functions.release(
                self._keys.members(self._group),
                self._keys.owners(self._group),
                self.member_id,
                [partition_id(tp.topic, tp.partition) for tp in owned],
                leave=True,
            )


def _partition_ids(topics: Sequence[str], counts: Sequence[int]) -> list[str]:
    """The ids of every partition of ``topics``, whose partition counts are ``counts``, sorted."""
    pairs = zip(topics, counts, strict=True)
    return sorted(partition_id(topic, p) for topic, count in pairs for p in range(count))


def _runs(offsets: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted ``offsets`` as runs of consecutive ones, each ``(first, one past the last)``."""
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], offset + 1)
        elif not runs or runs[-1][1] < offset:
            runs.append((offset, offset + 1))
    return runs
