"""A Redis Streams reader in no consumer group: ``XREAD`` from ids it keeps in memory.

``pipeline tail`` and a redrive's dry run read this way. A consumer group would hold every entry
read in its pending list until acknowledged; a reader killed before it deleted such a group would
leave it on the streams for ever, with all it had read. This reader creates nothing on Redis.

Earlier releases read with such groups (``pipeline-tail-*``, ``pipeline-redrive.*.dry.*``); at
its first poll a reader removes those of them that a killed run left on the streams it reads: the
ones whose every consumer has been idle for ``STALE_GROUP_MS``.

A partition whose stream key holds another type (``WRONGTYPE``: another program wrote it) fails
a read of all the streams at once; the reader finds which (:func:`~.broken.probe`), sets it aside
with one line naming the partition, its key and what to do, and reads the others on. It tries
the key again with backoff (0.5 s doubling to 5 s) and reads the partition again once it holds a
stream or none (deleted: the stream is made again at the partition's next message).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline.config import RedisSettings
from pipeline.envelope import Message, TopicPartition
from pipeline.transport.protocol import StartAt
from pipeline.transport.redis_streams.admin import read_meta
from pipeline.transport.redis_streams.broken import Broken, probe
from pipeline.transport.redis_streams.consumer import decode_entry
from pipeline.transport.redis_streams.errors import is_wrong_type, no_stream, translate
from pipeline.transport.redis_streams.keys import Keys

log = logging.getLogger(__name__)
_LAST_SEQ = 2**64 - 1
"""The largest sequence part of a stream entry id."""
_ONE_OFF_GROUP = re.compile(
    r"pipeline-tail-[0-9a-f]{8}|pipeline-redrive\..+\.[0-9a-f]{10}\.dry\.[0-9a-f]{8}"
)
"""The groups ``pipeline tail`` and a redrive's dry run of earlier releases made for one run."""
STALE_GROUP_MS = 10 * 60 * 1000
"""How long every consumer of such a group must have been idle for it to count as left behind."""


def id_before(offset: int) -> str:
    """The greatest entry id below every entry of ``offset`` (``XREAD`` reads past it)."""
    return f"{offset}-{_LAST_SEQ}"


class RedisStreamsReader:
    """A :class:`~pipeline.transport.protocol.Reader` on Redis Streams."""

    def __init__(
        self,
        client: Redis,
        keys: Keys,
        settings: RedisSettings,
        topics: Sequence[str],
        *,
        start_at: StartAt = "earliest",
    ) -> None:
        """Read ``topics``; the partitions they have are read from Redis at each poll."""
        self._client = client
        self._keys = keys
        self._settings = settings
        self._topics = list(topics)
        self._start_at = start_at
        self._started = False
        self._after: dict[TopicPartition, str | bytes] = {}  # the id each partition reads past
        self._aside: dict[TopicPartition, Broken] = {}  # keys of another type, not read for now

    async def poll(self, max_messages: int = 500, timeout_s: float = 1.0) -> list[Message]:
        """Up to ``max_messages`` entries past each partition's last one returned (``XREAD``)."""
        try:
            await self._take_partitions()
            return await self._read(max_messages, timeout_s)
        except rexc.RedisError as exc:
            raise translate(exc, f"read {self._topics}") from exc

    async def _take_partitions(self) -> None:
        """Add the partitions the topics have now (``pipeline topics apply`` may add some).

        At the first poll with ``latest``, a partition is read past its last entry then; a
        partition added later is read from its start.
        """
        latest = self._start_at == "latest" and not self._started
        new: list[TopicPartition] = []
        for topic in self._topics:
            meta = await read_meta(self._client, self._keys, topic, self._settings.max_len)
            new += [
                tp
                for tp in (TopicPartition(topic, p) for p in range(meta.partitions))
                if tp not in self._after and tp not in self._aside
            ]
        bad = await self._wrong_types(new)
        for tp in new:
            if tp in bad:
                self._set_aside(tp)
                continue
            if not self._started:
                await self._forget_left_groups(tp)
            self._after[tp] = await self._last_id(tp) if latest else "0-0"
        self._started = True
        await self._try_aside()

    async def _wrong_types(self, partitions: Sequence[TopicPartition]) -> set[TopicPartition]:
        """Those of ``partitions`` whose stream key holds another type (one pipelined probe)."""
        found = await probe(self._client, self._keys, None, partitions)
        return {tp for tp, state in found.items() if state == "wrong_type"}

    def _set_aside(self, tp: TopicPartition) -> None:
        """Leave ``tp`` out of reads, with one line naming it, its key and what to do."""
        self._aside[tp] = Broken.found("wrong_type")
        stream = self._keys.stream(tp.topic, tp.partition)
        log.warning(
            "partition %s[%d] is not read: its %s: the partition's stream is made again at its"
            " next message and read from then on; the other partitions are read",
            tp.topic,
            tp.partition,
            no_stream(stream),
        )

    async def _try_aside(self) -> None:
        """Read again each partition set aside whose key, due a try, no longer holds another type.

        One set aside before its first read is read from its start: its stream, made again
        after the key was deleted, holds only messages produced since.
        """
        now = time.monotonic()
        due = [tp for tp, broken in self._aside.items() if broken.due(now)]
        if not due:
            return
        bad = await self._wrong_types(due)
        for tp in due:
            if tp in bad:
                self._aside[tp].failed_again("wrong_type")
                continue
            del self._aside[tp]
            self._after.setdefault(tp, "0-0")
            log.info("partition %s[%d] holds a stream again: read on", tp.topic, tp.partition)

    async def _forget_left_groups(self, tp: TopicPartition) -> None:
        """Destroy the one-off groups of earlier releases that a killed run left on ``tp``."""
        stream = self._keys.stream(tp.topic, tp.partition)
        if not await self._client.exists(stream):
            return
        groups: list[dict[str, Any]] = await self._client.xinfo_groups(stream)
        for group in groups:
            name = group["name"].decode(errors="replace")
            if not _ONE_OFF_GROUP.fullmatch(name) or not group["consumers"]:
                continue
            consumers: list[dict[str, Any]] = await self._client.xinfo_consumers(stream, name)
            if all(int(c["idle"]) >= STALE_GROUP_MS for c in consumers):
                await self._client.xgroup_destroy(stream, name)
                keys = self._keys
                await self._client.delete(
                    keys.members(name), keys.owners(name), keys.positions(name)
                )
                log.info(
                    "removed group %s left on %s[%d] by a killed run (%d entries it held)",
                    name,
                    tp.topic,
                    tp.partition,
                    int(group["pending"]),
                )

    async def _last_id(self, tp: TopicPartition) -> str | bytes:
        last: Any = await self._client.xrevrange(self._keys.stream(tp.topic, tp.partition), count=1)
        return last[0][0] if last else "0-0"

    async def _read(self, max_messages: int, timeout_s: float) -> list[Message]:
        read = sorted(tp for tp in self._after if tp not in self._aside)
        if not read:
            if self._aside:  # every partition set aside: wait as a read would, up to a try
                next_try_s = min(b.next_at_s for b in self._aside.values()) - time.monotonic()
                await asyncio.sleep(max(0.0, min(timeout_s, next_try_s)))
            return []
        by_stream = {self._keys.stream(tp.topic, tp.partition): tp for tp in read}
        streams: dict[Any, Any] = {stream: self._after[tp] for stream, tp in by_stream.items()}
        block_ms = max(1, int(min(timeout_s, self._settings.socket_timeout_s / 2) * 1000))
        try:
            reply: Any = await self._client.xread(
                streams, count=max(1, max_messages // len(streams)), block=block_ms
            )
        except rexc.ResponseError as exc:
            bad = await self._wrong_types(read) if is_wrong_type(str(exc)) else set()
            if not bad:
                raise
            for tp in bad:
                self._set_aside(tp)
            return []  # the next poll reads the others
        out: list[Message] = []
        for stream_raw, entries in reply or []:
            tp = by_stream[stream_raw.decode()]
            for eid, fields in entries:
                if len(out) >= max_messages:
                    break  # the rest of them come with the next poll
                out.append(decode_entry(tp, eid, fields))
                self._after[tp] = eid
        return out

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make the next polls of ``tp`` start at ``offset``."""
        self._after[tp] = id_before(offset)

    async def close(self) -> None:
        """Nothing to release: the reader holds nothing on Redis, the client is the transport's."""
