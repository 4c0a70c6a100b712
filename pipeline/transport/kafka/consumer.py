"""A Kafka consumer-group member with manual commits and cooperative rebalancing.

Every call into librdkafka's consumer runs on one dedicated thread, so blocking fetches never
stall the event loop and the client is never used from two threads at once. Rebalance callbacks
fire on that thread inside :meth:`KafkaConsumer.poll`, which lets a listener commit in
``on_revoked`` before its partitions move.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from confluent_kafka import Consumer as _RawConsumer
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as _RawTP

from pipeline.config import KafkaSettings, declare_hint
from pipeline.envelope import Message, Position, TopicPartition
from pipeline.errors import ConfigError, TransportError, UnknownTopic
from pipeline.transport.kafka.client_log import SessionLog
from pipeline.transport.kafka.consumer_thread import ConsumerThread
from pipeline.transport.kafka.errors import translate
from pipeline.transport.kafka.group import (
    Protocol,
    apply_group_timeouts,
    choose_protocol,
    client_error,
    consumer_config,
)
from pipeline.transport.kafka.stranded import StrandWatch
from pipeline.transport.protocol import RebalanceListener, StartAt
from pipeline.transport.retention import report_lost

log = logging.getLogger(__name__)
_POLL_SLICE_S = 0.05
_REJOIN_BACKOFF_S = 1.0
_ANNOUNCE_RETRY_S = 1.0
"""How soon a failed read of assigned partitions' committed positions is tried again."""
_SELF_FENCE_WINDOW_S = 10.0
"""A fence this soon after the consumer's own session timed out is its own rejoin's doing."""
_POLL_INTERVAL_MS = 300_000
"""librdkafka's default ``max.poll.interval.ms``."""
_REVOKE_MARGIN_S = 5.0
"""What a revocation leaves of the poll interval for the commit and the rebalance's own steps."""
T = TypeVar("T")

_OFFSET_RESET = re.compile(r"(\S+) \[(\d+)\]: offset reset \(at offset (\d+)")
"""librdkafka's line for a fetch position it moved: "T [p]: offset reset (at offset N ..."."""

_IGNORED = {KafkaError._PARTITION_EOF}  # noqa: SLF001 - librdkafka's local error code
_FATAL_TOPIC = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC}  # noqa: SLF001


def first_then_fetched(
    raw: Any, max_messages: int, timeout_s: float, pending: Callable[[], bool]
) -> list[Any]:
    """Up to ``max_messages`` librdkafka messages: the first waited for, the rest already here.

    ``consume(n, timeout)`` waits for n messages or the whole timeout, which would hold a lone
    message back for up to ``timeout_s``: wait for the first, then take what is already fetched
    without waiting. The wait is polled in short slices, and given up as soon as ``pending()``
    says a call waits behind it on the client's thread, so a pause, resume, seek or commit
    queued meanwhile runs at once instead of after the whole timeout (resuming a drained
    partition is on the hot path of flow control).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        first = raw.poll(min(_POLL_SLICE_S, max(0.0, deadline - time.monotonic())))
        if first is not None:
            break
        if time.monotonic() >= deadline or pending():
            return []
    return [first, *raw.consume(max_messages - 1, 0)] if max_messages > 1 else [first]


def _gone(topic: str | None, err: Any, topics: object) -> TransportError:
    """The error of a topic that does not exist (deleted while read): Redis Streams' line.

    librdkafka's own words (``Subscribed topic not available: T: Broker: Unknown topic or
    partition``) name the topic twice; an error that names none keeps them.
    """
    if not topic:
        return translate(err, f"consume {topics}")
    return UnknownTopic(f"topic {topic!r} does not exist ({declare_hint()})")


def messages_of(raw: Sequence[Any], role: str, topics: object) -> list[Message]:
    """The messages among librdkafka's results for the ``role`` (consumer, reader) of ``topics``.

    A missing topic raises its translation, a fatal error :class:`TransportError`; a partition's
    end is no error, any other is logged.
    """
    out: list[Message] = []
    for item in raw:
        err = item.error()
        if err is None:
            out.append(_to_message(item))
        elif err.code() in _FATAL_TOPIC:
            raise _gone(item.topic(), err, topics)
        elif err.fatal():
            raise TransportError(f"{role} of {topics}: {err.str()}")
        elif err.code() not in _IGNORED:
            log.warning("%s error: %s", role, err.str())
    return out


def _to_message(raw: Any) -> Message:
    headers = raw.headers()
    # Positional, in Message's field order (topic, partition, offset, key, value, headers,
    # timestamp_ms): once per message, seven keywords cost a third of the call.
    return Message(
        raw.topic(),
        raw.partition(),
        raw.offset(),
        raw.key(),
        raw.value() or b"",
        {k: v or b"" for k, v in headers} if headers else {},
        raw.timestamp()[1],
    )


def _tps(raw: Sequence[Any]) -> list[TopicPartition]:
    return [TopicPartition(p.topic, p.partition) for p in raw]


class _MemberLog(SessionLog):
    """A member's librdkafka lines, with the fetch positions librdkafka reset kept too.

    A fetch below the partition's first record (retention removed the records the group had
    not read) fails with "Offset out of range", and ``auto.offset.reset`` moves the position
    on without an error to the application: this line is the only sign. The logger is served
    by ``poll`` on the consumer's thread (``log.queue``), before the records fetched after it.
    """

    __slots__ = ("resets",)

    def __init__(self, target: logging.Logger) -> None:
        """Pass lines on to ``target``; no reset yet."""
        super().__init__(target)
        self.resets: list[tuple[TopicPartition, int]] = []
        """(partition, offset it was fetched at) of each reset not yet reported."""

    def log(self, level: int, msg: str, *args: object) -> None:
        """One librdkafka log line."""
        found = _OFFSET_RESET.search(str(args[-1])) if args and args[0] == "OFFSET" else None
        if found is not None:
            self.resets.append((TopicPartition(found[1], int(found[2])), int(found[3])))
        super().log(level, msg, *args)


class KafkaConsumer:
    """A :class:`~pipeline.transport.protocol.Consumer` on confluent-kafka."""

    def __init__(
        self,
        settings: KafkaSettings,
        group: str,
        topics: Sequence[str],
        *,
        listener: RebalanceListener | None = None,
        member_id: str | None = None,
        instance: str | None = None,
        start_at: StartAt = "earliest",
    ) -> None:
        """Create the member; it picks its protocol and joins the group on the first poll.

        Args:
            settings: the Kafka section of the settings.
            group: the group id.
            topics: the topics to subscribe to.
            listener: told of assigned and revoked partitions.
            member_id: this member's name in logs and ``client.id`` (default: ``instance``,
                else random).
            instance: the stable name for ``group.instance.id`` (static membership), or None
                for a dynamic member.
            start_at: where a partition without a committed position starts.
        """
        self.member_id = member_id or instance or uuid.uuid4().hex[:12]
        self.instance = instance
        self.protocol: Protocol | None = None
        self._group = group
        self._start_at = start_at
        self._settings = settings
        self._topics = list(topics)
        self._listener = listener
        self._assigned: set[TopicPartition] = set()
        self._unannounced: set[TopicPartition] = set()
        """Assigned, but their committed positions could not be read: paused, the listener
        not yet told (it would start them at 0, and commit 0 for an idle one)."""
        self._announce_at = 0.0
        self._worker = ConsumerThread(f"kafka-consumer-{group}")
        self._raw_consumer: Any = None
        self._session_log = _MemberLog(logging.getLogger("pipeline.librdkafka"))
        self._rejoin_at = 0.0
        self._subscribed = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch: StrandWatch | None = None
        """Classic groups: partitions a rebalance left to no member are found and given out."""
        self._watching: asyncio.Task[object] | None = None
        self._recheck_topics = False
        """KIP-848: partitions were revoked; the next poll checks that the topics still exist."""

    @property
    def revoke_budget_s(self) -> float:
        """How long a revocation may wait on running work before the group drops this member.

        The group's rebalance timeout, and librdkafka's own check that the member polls, is
        ``max.poll.interval.ms``; the listener runs inside a poll, so it must return well within
        it: the interval less :data:`_REVOKE_MARGIN_S` (half of a shorter interval).
        """
        try:
            interval_ms = int(self._settings.client.get("max.poll.interval.ms", _POLL_INTERVAL_MS))
        except ValueError:  # librdkafka refuses it when the client is built
            interval_ms = _POLL_INTERVAL_MS
        interval_s = interval_ms / 1000
        return interval_s - min(_REVOKE_MARGIN_S, interval_s / 2)

    @property
    def _raw(self) -> Any:
        """The librdkafka consumer, built on first use (consumer thread only)."""
        if self._raw_consumer is None:
            self._raw_consumer = self._open()
        return self._raw_consumer

    def _open(self) -> Any:
        """Choose the protocol and build the client; bad properties are a ConfigError."""
        self.protocol = protocol = choose_protocol(self._settings, static=self.instance is not None)
        if protocol == "consumer":
            apply_group_timeouts(self._settings, self._group)
        config = consumer_config(
            self._settings,
            self._group,
            self.member_id,
            protocol=protocol,
            instance=self.instance,
        )
        try:
            raw = _RawConsumer(
                self._session_log.heard(
                    {**config, "auto.offset.reset": self._start_at, "logger": self._session_log}
                )
            )
        except KafkaException as exc:
            problem = client_error(exc, protocol, self._settings)
            if problem is not None:
                raise problem from None
            raise translate(exc, "create consumer") from exc
        log.info(
            "member %s of %s: %s protocol%s",
            self.member_id,
            self._group,
            protocol,
            f", static as {self.instance}" if self.instance else "",
        )
        return raw

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self._worker.submit(fn, *args))

    def _in_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a listener coroutine on the event loop and wait for it (consumer thread)."""
        assert self._loop is not None  # noqa: S101 - set by poll/close before callbacks fire
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _committed_sync(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, Position]:
        raw = self._raw.committed(
            [_RawTP(tp.topic, tp.partition) for tp in tps],
            timeout=self._settings.request_timeout_ms / 1000,
        )
        return {
            TopicPartition(p.topic, p.partition): Position(
                TopicPartition(p.topic, p.partition), p.offset, p.metadata or ""
            )
            for p in raw
            if p.offset >= 0
        }

    def _on_assign(self, _raw: Any, partitions: list[Any]) -> None:
        tps = _tps(partitions)
        # librdkafka keeps a partition's pause flag across revoke and re-assign; a new
        # assignment must start flowing, whatever was paused before it was revoked.
        self._raw.resume(partitions)
        if not (self._listener and tps):
            self._assigned.update(tps)
            return
        try:
            committed = self._committed_sync(tps)
        except KafkaException as exc:
            self._raw.pause(partitions)
            self._unannounced.update(tps)
            self._announce_at = time.monotonic() + _ANNOUNCE_RETRY_S
            log.warning(
                "could not read committed positions of %s: %s; they stay paused until it can",
                [f"{tp.topic}[{tp.partition}]" for tp in tps],
                exc,
            )
            return
        self._assigned.update(tps)
        self._in_loop(self._listener.on_assigned(tps, committed))

    def _announce(self) -> None:
        """Read the positions a failed read left unknown; then give their partitions out."""
        if time.monotonic() < self._announce_at or self._listener is None:
            return
        tps = sorted(self._unannounced)
        try:
            committed = self._committed_sync(tps)
        except KafkaException as exc:
            self._announce_at = time.monotonic() + _ANNOUNCE_RETRY_S
            log.warning("still cannot read committed positions of %s: %s", tps, exc)
            return
        self._unannounced.difference_update(tps)
        self._assigned.update(tps)
        self._raw.resume([_RawTP(tp.topic, tp.partition) for tp in tps])
        self._in_loop(self._listener.on_assigned(tps, committed))

    def _on_revoke(self, _raw: Any, partitions: list[Any], *, lost: bool = False) -> None:
        # Only what the listener holds: a client closed after its partitions were revoked as
        # lost (a rejoin, a fatal error) revokes them again inside close().
        revoked = _tps(partitions)
        self._unannounced.difference_update(revoked)  # never given to the listener
        tps = [tp for tp in revoked if tp in self._assigned]
        if self._listener and tps:
            positions = self._in_loop(self._listener.on_revoked(tps, lost=lost))
            if positions and not lost:
                try:
                    self._commit(positions)
                except TransportError as exc:
                    log.warning("commit on revocation of %s failed: %s", tps, exc)
        self._assigned.difference_update(tps)
        # KIP-848 takes a deleted topic's partitions away without an error: look at the next poll.
        self._recheck_topics = self._recheck_topics or self.protocol == "consumer"

    def _on_lost(self, raw: Any, partitions: list[Any]) -> None:
        self._on_revoke(raw, partitions, lost=True)

    def _subscribe(self) -> None:
        raw = self._raw  # built first: that chooses the protocol
        if self.protocol == "consumer":
            self._require_topics()
        raw.subscribe(
            self._topics,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self._subscribed = True
        if self.protocol == "classic" and self._watch is None:
            self._watch = StrandWatch(self._settings, self._group, self._topics)

    def _joined(self) -> None:
        """Subscribe on the first poll; give out partitions whose positions were unknown."""
        if not self._subscribed:
            self._subscribe()
        if self._unannounced:
            self._announce()
        if self._recheck_topics:
            self._recheck_topics = False
            try:
                self._require_topics()
            except UnknownTopic:
                raise
            except TransportError as exc:  # the broker's trouble: the poll says so if it lasts
                log.debug("checking %s after a revocation failed: %s", self._topics, exc)

    def _require_topics(self) -> None:
        """Fail on an undeclared topic (the consumer protocol waits for it without a word)."""
        timeout_s = self._settings.request_timeout_ms / 1000
        for topic in self._topics:
            try:
                meta = self._raw.list_topics(topic, timeout=timeout_s).topics.get(topic)
            except KafkaException as exc:
                raise translate(exc, f"consume {self._topics}") from exc
            if meta is None or meta.error is not None:
                error = meta.error if meta is not None else KafkaError(KafkaError._UNKNOWN_TOPIC)  # noqa: SLF001
                if error.code() in _FATAL_TOPIC:
                    raise _gone(topic, error, self._topics)
                raise translate(error, f"consume {self._topics}")

    def _consume(self, max_messages: int, timeout_s: float) -> list[Any]:
        batch = self._fetch(max_messages, timeout_s)
        if self._session_log.resets and self._raw_consumer is not None:
            self._report_resets(batch)
        return batch

    def _report_resets(self, batch: Sequence[Any]) -> None:
        """Report what each reset position skipped: the records retention removed unread.

        The skipped range ends at the partition's first record (its low watermark, read from
        the broker), or at the first record delivered after the reset if that is lower (the
        watermark read after further deletions). The group's position is then moved past the
        gap (:meth:`_commit_past`), so a member that takes the partition over before this one
        commits does not count the same range again.
        """
        resets, self._session_log.resets = self._session_log.resets, []
        timeout_s = self._settings.request_timeout_ms / 1000
        for tp, at in resets:
            raw_tp = _RawTP(tp.topic, tp.partition)
            try:
                low, high = self._raw.get_watermark_offsets(raw_tp, timeout_s, cached=False)
            except KafkaException as exc:
                log.error(  # noqa: TRY400 - the broker error is the whole story
                    "group %r lost messages of %s[%d] to retention from offset %d (Kafka no "
                    "longer held it; how many is unknown, its first offset could not be read: "
                    "%s); raise the topic's retention or add members",
                    self._group,
                    tp.topic,
                    tp.partition,
                    at,
                    exc,
                )
                continue
            delivered = [
                m.offset()
                for m in batch
                if m.error() is None
                and m.topic() == tp.topic
                and m.partition() == tp.partition
                and m.offset() >= at
            ]
            end = min([low, *delivered])
            report_lost(self._group, tp, at, end, transport="kafka")
            if end > at:
                self._commit_past(tp, at, end, empty=low >= high)

    def _commit_past(self, tp: TopicPartition, at: int, end: int, *, empty: bool) -> None:
        """Commit ``end`` for ``tp`` if the group's position is still ``at``, below the gap.

        Only a position the group committed is moved (a reset at this member's own position,
        with records it holds below it, is left to the member's next commit), and only when no
        metadata would be lost: the committed one is empty, or the partition holds no record
        any more (metadata speaks of offsets the partition held). Otherwise the member's next
        commit past the gap does it.
        """
        if tp not in self._assigned:
            return
        try:
            committed = self._committed_sync([tp]).get(tp)
            if committed is None or committed.offset != at or (committed.metadata and not empty):
                return
            self._raw.commit(offsets=[_RawTP(tp.topic, tp.partition, end)], asynchronous=False)
        except KafkaException as exc:
            log.warning(
                "group %r: could not commit %s[%d] past the records retention removed (%s); "
                "a member that takes it over counts them again",
                self._group,
                tp.topic,
                tp.partition,
                exc,
            )

    def _fetch(self, max_messages: int, timeout_s: float) -> list[Any]:
        if self._raw_consumer is None and time.monotonic() < self._rejoin_at:
            time.sleep(min(timeout_s, _POLL_SLICE_S, self._rejoin_at - time.monotonic()))
            return []
        self._joined()
        try:
            batch = first_then_fetched(self._raw, max_messages, timeout_s, self._worker.pending)
        except KafkaException as exc:
            raise translate(exc, "consume") from exc
        for item in batch:
            err = item.error()
            if err is not None and (err.fatal() or err.code() == KafkaError._FATAL):  # noqa: SLF001
                self._on_fatal(err)
                return []
        return batch

    def _on_fatal(self, err: KafkaError) -> None:
        """A fatal error ends the client: rejoin with a new one, or stop on a name clash.

        Under KIP-848 a static member that died without leaving (``kill -9``) keeps its
        ``group.instance.id`` until its session on the broker expires, and its replacement is
        refused with UNRELEASED_INSTANCE_ID, which librdkafka makes fatal. The replacement
        retries with a new client every second until the broker lets the name go.

        A fence right after this consumer's own session timed out is its own doing (see
        :mod:`.client_log`): it rejoins with a new client once. Any other fence is a second
        live member with the same name, and stops this one.
        """
        text = err.str()
        self._close_raw()
        if "still used by another member" in text or "UNRELEASED_INSTANCE_ID" in text:
            log.info("instance %s not yet released by the broker; rejoining", self.instance)
            self._rejoin_at = time.monotonic() + _REJOIN_BACKOFF_S
            return
        if "fenced" in text.lower():
            if self._session_log.lost_session_within(_SELF_FENCE_WINDOW_S):
                log.warning(
                    "member %s of %s was fenced by its own rejoin after its session timed out;"
                    " rejoining with a new client",
                    self.instance,
                    self._group,
                )
                self._rejoin_at = time.monotonic() + _REJOIN_BACKOFF_S
                return
            raise ConfigError(
                f"member {self.instance!r} of group {self._group!r} was fenced: another live"
                " member uses the same --instance name; give each member its own"
            )
        raise TransportError(f"consumer of {self._group!r} failed: {text}")

    def _close_raw(self) -> None:
        raw, self._raw_consumer, self._subscribed = self._raw_consumer, None, False
        if raw is not None:
            if self._assigned and self._listener:
                lost = sorted(self._assigned)
                self._in_loop(self._listener.on_revoked(lost, lost=True))
            self._assigned.clear()
            self._unannounced.clear()
            try:
                raw.close()
            except (KafkaException, RuntimeError) as exc:
                log.debug("close of a failed consumer: %s", exc)

    async def poll(self, max_messages: int = 500, timeout_s: float = 1.0) -> list[Message]:
        """Fetch up to ``max_messages``; rebalance callbacks run inside this call."""
        self._loop = asyncio.get_running_loop()
        self._watch_group()
        raw = await self._call(self._consume, max_messages, timeout_s)
        return messages_of(raw, "consumer", self._topics)

    def _watch_group(self) -> None:
        """Start a check for partitions assigned to no member when one is due (classic groups)."""
        watch = self._watch
        if watch is None or self._watching is not None or not watch.due():
            return
        self._watching = asyncio.create_task(asyncio.to_thread(watch.check))
        self._watching.add_done_callback(self._watched)

    def _watched(self, task: asyncio.Task[object]) -> None:
        self._watching = None
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            log.warning("check of group %s's assignment failed: %s", self._group, failure)

    def _commit(self, positions: Sequence[Position]) -> None:
        # The coordinator takes a commit from any member of the group, for any partition: a
        # stale one (computed before a rebalance moved the partition, whose revocation then
        # committed a later position) would move the new owner's position back. Only what
        # this member is assigned is committed, as the Redis Streams lease fences commits.
        owned = [p for p in positions if p.tp in self._assigned]
        if len(owned) < len(positions):
            log.warning(
                "%s: %s no longer assigned to this member; not committed",
                self.member_id,
                sorted(f"{p.tp.topic}[{p.tp.partition}]" for p in positions if p not in owned),
            )
        if not owned:
            return
        offsets = [
            _RawTP(p.tp.topic, p.tp.partition, p.offset, p.metadata)
            if p.metadata
            else _RawTP(p.tp.topic, p.tp.partition, p.offset)
            for p in owned
        ]
        try:
            self._raw.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError._NO_OFFSET:  # noqa: SLF001
                return
            raise translate(exc, "commit") from exc

    async def commit(self, positions: Sequence[Position]) -> None:
        """Synchronously commit each position (with its metadata) to the group coordinator."""
        if positions:
            await self._call(self._commit, positions)

    async def committed(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, Position]:
        """The group's committed positions with their metadata."""
        try:
            return await self._call(self._committed_sync, partitions)
        except KafkaException as exc:
            raise translate(exc, "committed") from exc

    def pause(self, partitions: Sequence[TopicPartition]) -> None:
        """Stop fetching these partitions (librdkafka ``pause``), without blocking the loop.

        librdkafka's pause waits while another thread is inside ``consume``, so the call is
        queued on the consumer's own thread; it takes effect before the next fetch.
        """
        raw = [_RawTP(tp.topic, tp.partition) for tp in partitions]
        self._background(self._pause, raw)

    def _pause(self, raw: list[Any]) -> None:
        if self._raw_consumer is not None:
            self._raw_consumer.pause(raw)

    def resume(self, partitions: Sequence[TopicPartition]) -> None:
        """Fetch again from these partitions, from where this member stopped consuming them.

        A pause drops librdkafka's prefetched messages and the refetch would only start after
        a fetch backoff; seeking to the current position makes it start at once.
        """
        raw = [_RawTP(tp.topic, tp.partition) for tp in partitions]
        self._background(self._resume_and_seek, raw)

    def _resume_and_seek(self, raw: list[Any]) -> None:
        if self._raw_consumer is None:
            return
        self._raw.resume(raw)
        for position in self._raw.position(raw):
            if position.offset >= 0:
                try:
                    self._raw.seek(position)
                except KafkaException as exc:  # not yet fetching: the resume alone will do
                    log.debug("seek after resume of %s skipped: %s", position, exc)

    def _background(self, fn: Callable[..., object], *args: Any) -> None:
        if self._closed or self._raw_consumer is None:
            return
        future = self._worker.submit(fn, *args)
        future.add_done_callback(_log_failure)

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member owns now."""
        return set(self._assigned)

    def _seek(self, raw: Any) -> None:
        self._raw.seek(raw)

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make the next fetch of ``tp`` start at ``offset``."""
        try:
            await self._call(self._seek, _RawTP(tp.topic, tp.partition, offset))
        except KafkaException as exc:
            raise translate(exc, f"seek {tp}") from exc

    async def rejoin(self) -> None:
        """Close this member's client and join again with a new one at the next poll.

        Every partition is revoked as lost first (its uncommitted messages are delivered again
        to whoever owns it now); the group coordinator's answer to the new client is then the
        assignment. A static member keeps its ``group.instance.id`` and takes its own place
        back.
        """
        self._loop = asyncio.get_running_loop()
        await self._call(self._rejoin)

    def _rejoin(self) -> None:
        if self._closed or self._raw_consumer is None:
            return
        log.warning("member %s of %s rejoins its group", self.member_id, self._group)
        self._close_raw()

    def _close_open(self) -> None:
        if self._raw_consumer is not None:
            self._raw_consumer.close()

    async def close(self) -> None:
        """Leave the group (revoking partitions through the listener) and free the thread."""
        if self._closed:
            return
        self._closed = True
        self._loop = asyncio.get_running_loop()
        if self._watch is not None:
            self._watch.stop()  # a nudge under way must not hold the process's exit
        # librdkafka's close can hang in a cooperative rebalance; the group then drops this
        # member after its session timeout, which is what a bounded close waits for at most.
        limit_s = self._settings.session_timeout_ms / 1000 + 5
        try:
            await asyncio.wait_for(self._call(self._close_open), limit_s)
        except TimeoutError:
            log.warning("consumer close did not finish in %.0fs; the group will expire it", limit_s)
        finally:
            self._worker.stop()


def _log_failure(future: Future[object]) -> None:
    error = future.exception()
    if error is not None:
        log.warning("consumer call failed: %s", error)
