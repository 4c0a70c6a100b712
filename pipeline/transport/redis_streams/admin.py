"""Topic metadata, lag and oldest-unconsumed age for the Redis Streams transport.

A topic is declared in the ``P:topics`` hash (partitions, max_len, retention); its partitions are
the streams ``{P:T:p}:s``. Retention on Redis is by length (``XADD MAXLEN ~``): ``retention_ms``
is kept for display only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline.config import declare_hint
from pipeline.envelope import TopicPartition
from pipeline.errors import GroupNotEmpty, TransportError, UnknownTopic
from pipeline.transport.protocol import PartitionLag, TopicConfig, TopicInfo
from pipeline.transport.redis_streams.errors import (
    is_wrong_type,
    no_stream,
    translate,
    wrong_type_of_partition,
)
from pipeline.transport.redis_streams.keys import Keys, entry_id, offset_of, partition_id

log = logging.getLogger(__name__)

_TIMESTAMP_DIGITS = 19
"""The most digits a ``t`` field is read with (a signed 64-bit number's)."""
_GLOB = re.compile(r"[*?\[\]\\]")
"""The characters a ``SCAN MATCH`` pattern reads as wildcards; escaped with a backslash."""


class UnreadableTopicMeta(TransportError):
    """A topic's entry in the topics hash cannot be read; the line names the topic and field.

    Attributes:
        lines: one line per unreadable entry (the message is the first, and how many more).
        readable: from :meth:`RedisStreamsAdmin.list_topics`, the topics it could read.
    """

    def __init__(
        self, lines: Sequence[str], readable: Mapping[str, TopicInfo] | None = None
    ) -> None:
        """The error of the entries ``lines`` describe; ``readable`` the topics read beside."""
        more = f" (and {len(lines) - 1} more such entries)" if len(lines) > 1 else ""
        super().__init__(lines[0] + more)
        self.lines = tuple(lines)
        self.readable = dict(readable or {})


@dataclass(frozen=True, slots=True)
class TopicMeta:
    """What the transport stores about a topic."""

    partitions: int
    max_len: int
    retention_ms: int | None


async def read_meta(client: Redis, keys: Keys, topic: str, default_max_len: int) -> TopicMeta:
    """The stored metadata of ``topic``.

    Raises:
        UnknownTopic: the topic was never created.
        UnreadableTopicMeta: its stored metadata cannot be read (see :func:`decode_meta`).
        BrokerUnavailable: Redis cannot be reached.
    """
    try:
        raw = await client.hget(keys.topics, topic)
    except rexc.RedisError as exc:
        raise translate(exc, f"read topic {topic!r}") from exc
    if raw is None:
        raise UnknownTopic(f"topic {topic!r} does not exist ({declare_hint()})")
    return decode_meta(raw, default_max_len, topic, keys)


def timestamp_of(raw: bytes | None) -> int:
    """An entry's ``t`` field (set by ``pl_produce``); 0 when absent or no whole number.

    Another client's raw ``XADD`` may leave it out or write anything there.
    """
    if raw is None or not raw.isdigit() or len(raw) > _TIMESTAMP_DIGITS:
        return 0
    return int(raw)


def decode_meta(raw: bytes | str, default_max_len: int, topic: str, keys: Keys) -> TopicMeta:
    """A topic's metadata from its stored value in the topics hash ``keys.topics``.

    Raises:
        UnreadableTopicMeta: the value is no JSON object, its ``partitions`` is no whole number
            above 0, its ``max_len`` none above 0 (absent or 0 is ``default_max_len``) or its
            ``retention_ms`` none at or above 0 (absent or null is none): a hand edit, another
            program or release wrote it. The line names the topic, the field and the fix.
    """
    try:
        return _parsed(raw, default_max_len)
    except ValueError as exc:
        line = (
            f"topic {topic!r} has unreadable metadata in the Redis hash {keys.topics!r}: {exc}; "
            f"delete the entry (HDEL {keys.topics} {topic}) and run `pipeline topics apply` "
            "to write it again from its declaration"
        )
        raise UnreadableTopicMeta([line]) from None


def _parsed(raw: bytes | str, default_max_len: int) -> TopicMeta:
    """:func:`decode_meta` without the topic: a ValueError says what is wrong."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser
        raise ValueError(f"{raw[:100]!r} is not JSON") from None
    if not isinstance(data, dict):
        raise ValueError(f"{raw[:100]!r} is not a JSON object")  # noqa: TRY004 - one kind
    retention_ms = data.get("retention_ms")
    return TopicMeta(
        _whole(data, "partitions", least=1),
        _whole(data, "max_len", least=1) if data.get("max_len") else default_max_len,
        None if retention_ms is None else _whole(data, "retention_ms", least=0),
    )


def _whole(data: dict[str, Any], field: str, *, least: int) -> int:
    """The whole number ``data[field]``, at least ``least``.

    Raises:
        ValueError: it is missing or no such number; the message names the field.
    """
    value = data.get(field)
    try:
        number = int(value)  # type: ignore[arg-type]  # anything else raises below
    except (TypeError, ValueError, OverflowError):
        number = least - 1
    if number < least or isinstance(value, bool):
        raise ValueError(
            f"its field {field!r} is {value!r}, not a whole number of at least {least}"
        )
    return number


def _holds_another_type(reply: Any) -> TypeGuard[rexc.ResponseError]:
    """Whether a pipeline's ``reply`` is Redis saying its key holds another type (WRONGTYPE)."""
    return isinstance(reply, rexc.ResponseError) and is_wrong_type(str(reply))


def _wrong_type(replies: list[Any]) -> rexc.ResponseError | None:
    """The first of a pipeline's ``replies`` saying a key holds another type, if any.

    Any other error is raised.
    """
    for reply in replies:
        if _holds_another_type(reply):
            return reply
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
    return None


def _encode(config: TopicConfig, default_max_len: int) -> str:
    return json.dumps(
        {
            "partitions": config.partitions,
            "max_len": config.max_len or default_max_len,
            "retention_ms": config.retention_ms,
        }
    )


class RedisStreamsAdmin:
    """An :class:`~pipeline.transport.protocol.Admin` for Redis Streams."""

    def __init__(self, client: Redis, keys: Keys, default_max_len: int) -> None:
        """Use the transport's shared client."""
        self._client = client
        self._keys = keys
        self._default_max_len = default_max_len

    async def list_topics(self, names: Collection[str] | None = None) -> dict[str, TopicInfo]:
        """Every declared topic (or those of ``names``) with partitions, max_len and counts.

        Raises:
            UnreadableTopicMeta: an entry of the topics hash cannot be read, one line for each;
                its ``readable`` holds the other topics.
        """
        unreadable = []
        try:
            raw: dict[bytes, bytes] = await self._client.hgetall(self._keys.topics)  # type: ignore[assignment]
            out = {}
            for name_b in sorted(raw):
                try:
                    name = name_b.decode()
                except UnicodeDecodeError:
                    if names is None:
                        typed = name_b.decode("ascii", "backslashreplace")
                        unreadable.append(
                            f"the Redis hash {self._keys.topics!r} has a field {name_b[:100]!r} "
                            f"that is no topic name (not UTF-8); delete it (redis-cli HDEL "
                            f'{self._keys.topics} "{typed}")'
                        )
                    continue
                if names is not None and name not in names:
                    continue
                try:
                    meta = decode_meta(raw[name_b], self._default_max_len, name, self._keys)
                except UnreadableTopicMeta as exc:
                    unreadable.extend(exc.lines)
                    continue
                counts = await self._counts(name, meta.partitions)
                out[name] = TopicInfo(
                    name, meta.partitions, meta.retention_ms, counts, max_len=meta.max_len
                )
        except rexc.RedisError as exc:
            raise translate(exc, "list topics") from exc
        if unreadable:
            raise UnreadableTopicMeta(unreadable, out)
        return out

    async def _counts(self, name: str, partitions: int) -> tuple[int, ...]:
        """The messages each partition's stream holds; a key of another type holds none.

        Such a key (another program wrote there) fails one partition, not the listing: every
        other topic is still listed and applied (``pipeline topics apply`` reads them all), and
        one warning names the key.
        """
        pipe = self._client.pipeline(transaction=False)
        for p in range(partitions):
            pipe.xlen(self._keys.stream(name, p))
        counts = []
        for p, reply in enumerate(await pipe.execute(raise_on_error=False)):
            if _holds_another_type(reply):
                log.warning(
                    "topic %r partition %d, counted as empty: its %s: its stream is made again"
                    " at its next message",
                    name,
                    p,
                    no_stream(self._keys.stream(name, p)),
                )
                counts.append(0)
            elif isinstance(reply, rexc.RedisError):
                raise reply
            else:
                counts.append(int(reply))
        return tuple(counts)

    async def create_topic(self, config: TopicConfig) -> None:
        """Declare the topic; its streams appear with the first message or group.

        A deletion of the name cut short (:meth:`delete_topic`) is finished first: the new
        topic starts empty, at offset 0, with no group's positions.
        """
        await self._finish_deletion(config.name)
        try:
            created = await self._client.hsetnx(
                self._keys.topics, config.name, _encode(config, self._default_max_len)
            )
        except rexc.RedisError as exc:
            raise translate(exc, f"create topic {config.name!r}") from exc
        if not created:
            raise TransportError(f"create topic {config.name!r}: topic already exists")

    async def update_topic(self, config: TopicConfig) -> None:
        """Grow partitions (never shrink) and update max_len and retention."""
        meta = await read_meta(self._client, self._keys, config.name, self._default_max_len)
        if config.partitions < meta.partitions:
            raise TransportError(
                f"topic {config.name!r} has {meta.partitions} partitions; "
                f"it cannot shrink to {config.partitions}"
            )
        try:
            await self._client.hset(
                self._keys.topics, config.name, _encode(config, self._default_max_len)
            )
        except rexc.RedisError as exc:
            raise translate(exc, f"update topic {config.name!r}") from exc

    async def delete_topic(self, name: str) -> None:
        """Delete the topic's streams, offset counters and metadata.

        The positions groups committed on it go too, as Kafka forgets a deleted topic's
        offsets: a topic created again under the name starts at offset 0, and a group keeping
        the old positions would skip its first messages as done. A topic whose metadata cannot
        be read loses the partitions whose stream or offset counter exists.

        The metadata goes first: a member's read that a stream's deletion unblocks
        (``UNBLOCKED``) then finds the topic gone, instead of taking its partition up again and
        making the stream anew (``XGROUP CREATE MKSTREAM``). Its partitions are recorded before
        (``P:topics:deleting``) and forgotten last, so a deletion cut short (Redis gone, a
        refusal) is finished by the next ``delete_topic`` or ``create_topic`` of the name.
        """
        try:
            partitions: Iterable[int] = range(
                (await read_meta(self._client, self._keys, name, self._default_max_len)).partitions
            )
        except UnreadableTopicMeta:
            partitions = await self._partitions_found(name)
        except UnknownTopic:
            if not await self._finish_deletion(name):
                raise
            return
        await self._delete(name, partitions)

    async def _delete(self, name: str, partitions: Iterable[int]) -> None:
        """Record the deletion, drop the metadata, then each partition's keys and positions."""
        chosen = sorted(set(partitions))
        try:
            await self._client.hset(self._keys.deleting, name, ",".join(map(str, chosen)))
            await self._client.hdel(self._keys.topics, name)
            for p in chosen:
                stream = self._keys.stream(name, p)
                await self._forget_positions(stream, partition_id(name, p))
                await self._client.delete(stream, self._keys.sequence(name, p))
            await self._client.hdel(self._keys.deleting, name)
        except rexc.RedisError as exc:
            raise translate(exc, f"delete topic {name!r}") from exc

    async def _finish_deletion(self, name: str) -> bool:
        """Finish a deletion of topic ``name`` that was cut short; whether one was recorded.

        Its recorded partitions are deleted; a record that is no list of partitions (written by
        hand) is replaced by those whose stream or offset counter exists (a ``SCAN``). A deletion
        cut short before its metadata went is finished too, metadata and all: it was asked for,
        so a ``create_topic`` of that name (``pipeline topics apply``) starts the topic anew.
        """
        try:
            recorded = await self._client.hget(self._keys.deleting, name)
        except rexc.RedisError as exc:
            raise translate(exc, f"read the deletion of topic {name!r}") from exc
        if recorded is None:
            return False
        try:
            text = recorded.decode() if isinstance(recorded, bytes) else str(recorded)
            partitions: Iterable[int] = [int(p) for p in text.split(",") if p]
        except ValueError:
            partitions = await self._partitions_found(name)
        await self._delete(name, partitions)
        return True

    async def _partitions_found(self, name: str) -> set[int]:
        """The partitions of topic ``name`` whose stream or offset counter exists (a ``SCAN``)."""
        head = self._keys.stream(name, 0).removesuffix("0}:s")  # {P:T:
        own = re.compile(re.escape(head) + r"(\d+)\}:[sn]")
        found = set()
        try:
            async for key in self._client.scan_iter(
                match=_GLOB.sub(r"\\\g<0>", head) + "*", count=1000
            ):
                match = own.fullmatch(key.decode(errors="replace"))
                if match:  # not a partition of a topic named "T:1" and so on
                    found.add(int(match[1]))
        except rexc.RedisError as exc:
            raise translate(exc, f"delete topic {name!r}") from exc
        return found

    async def _forget_positions(self, stream: str, pid: str) -> None:
        """Drop the committed position of partition ``pid`` in every group reading ``stream``."""
        try:
            groups: list[dict[str, Any]] = await self._client.xinfo_groups(stream)
        except rexc.ResponseError:  # no such key: the stream was never written or read
            return
        for group in groups:
            name = group["name"]
            group_name = name.decode() if isinstance(name, bytes) else str(name)
            await self._client.hdel(self._keys.positions(group_name), pid, f"{pid}:meta")

    async def group_lag(self, group: str, topic: str) -> list[PartitionLag]:
        """Committed position, end offset and oldest unconsumed timestamp per partition."""
        meta = await read_meta(self._client, self._keys, topic, self._default_max_len)
        out = []
        try:
            for p in range(meta.partitions):
                stream = self._keys.stream(topic, p)
                pipe = self._client.pipeline(transaction=False)
                pipe.get(self._keys.sequence(topic, p))
                pipe.hget(self._keys.positions(group), partition_id(topic, p))
                pipe.xrange(stream, count=1)
                pipe.xrevrange(stream, count=1)
                replies = await pipe.execute(raise_on_error=False)
                wrong = _wrong_type(replies)
                if wrong is not None:  # one partition's key, not the lag of the others
                    out.append(self._unreadable(topic, p, wrong, replies))
                    continue
                end_raw, committed_raw, held, top = replies
                # An entry another client XADDed above the counter (an auto id) is the next
                # produce's to go past (pl_produce), so the end is past it already.
                end = max(int(end_raw or 0), offset_of(top[0][0]) + 1 if top else 0)
                committed = int(committed_raw) if committed_raw is not None else None
                start = min(offset_of(held[0][0]), end) if held else end
                oldest = None
                if max(committed or 0, start) < end:
                    first: Any = (
                        held
                        if (committed or 0) <= start
                        else await self._client.xrange(
                            stream, min=entry_id(committed or 0), count=1
                        )
                    )
                    if first:
                        oldest = timestamp_of(first[0][1].get(b"t"))
                out.append(PartitionLag(TopicPartition(topic, p), committed, end, oldest, start))
        except rexc.RedisError as exc:
            raise translate(exc, f"lag of {topic!r}") from exc
        return out

    def _unreadable(
        self, topic: str, p: int, wrong: rexc.ResponseError, replies: list[Any]
    ) -> PartitionLag:
        """The lag of a partition one of whose keys holds another type: nothing to read."""
        stream, sequence = self._keys.stream(topic, p), self._keys.sequence(topic, p)
        end_raw, committed_raw = replies[0], replies[1]
        committed = None if committed_raw is None else int(committed_raw)
        end = committed or 0
        if not isinstance(end_raw, BaseException):
            end = max(end, int(end_raw or 0))
        why = (
            wrong_type_of_partition(stream, sequence) if wrong is replies[0] else no_stream(stream)
        )
        return PartitionLag(TopicPartition(topic, p), committed, end, None, end, unreadable=why)

    async def delete_group(self, group: str, topics: Sequence[str]) -> None:
        """Destroy the group on every partition stream of ``topics`` and drop its state keys.

        A topic that no longer exists took its streams, and the group on them, with it.

        Raises:
            GroupNotEmpty: a member's lease has not run out (it runs, or held its partitions
                when it stopped), as Kafka refuses a group with members: deleted under a
                running member, the group's positions went with it, and the member read every
                partition again from offset 0.
        """
        try:
            seconds, micros = await self._client.time()
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            if await self._client.zcount(self._keys.members(group), f"({now_ms}", "+inf"):
                raise GroupNotEmpty(
                    f"delete group {group!r}: it still has members (stop them first; a member "
                    "that held its partitions leaves when its leases run out, "
                    "PIPELINE_REDIS__LEASE_MS after it stopped)"
                )
            for topic in topics:
                try:
                    meta = await read_meta(self._client, self._keys, topic, self._default_max_len)
                except UnknownTopic:
                    continue
                for p in range(meta.partitions):
                    with contextlib.suppress(rexc.ResponseError):  # stream never created
                        await self._client.xgroup_destroy(self._keys.stream(topic, p), group)
            await self._client.delete(
                self._keys.members(group), self._keys.owners(group), self._keys.positions(group)
            )
        except rexc.RedisError as exc:
            raise translate(exc, f"delete group {group!r}") from exc

    async def close(self) -> None:
        """The client belongs to the transport; nothing to release here."""
