"""A Redis Streams reader in no consumer group: ``XREAD`` from ids it keeps in memory.

``pipeline tail`` and a redrive's dry run read this way. A consumer group would hold every entry
read in its pending list until acknowledged; a reader killed before it deleted such a group would
leave it on the streams for ever, with all it had read. This reader creates nothing on Redis.

Earlier releases read with such groups (``pipeline-tail-*``, ``pipeline-redrive.*.dry.*``); at
its first poll a reader removes those of them that a killed run left on the streams it reads: the
ones whose every consumer has been idle for ``STALE_GROUP_MS``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline.config import RedisSettings
from pipeline.envelope import Message, TopicPartition
from pipeline.transport.protocol import StartAt
from pipeline.transport.redis_streams.admin import read_meta
from pipeline.transport.redis_streams.consumer import decode_entry
from pipeline.transport.redis_streams.errors import translate
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
        for topic in self._topics:
            meta = await read_meta(self._client, self._keys, topic, self._settings.max_len)
            for partition in range(meta.partitions):
                tp = TopicPartition(topic, partition)
                if tp not in self._after:
                    if not self._started:
                        await self._forget_left_groups(tp)
                    self._after[tp] = await self._last_id(tp) if latest else "0-0"
        self._started = True

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
        if not self._after:
            return []
        by_stream = {self._keys.stream(tp.topic, tp.partition): tp for tp in sorted(self._after)}
        streams: dict[Any, Any] = {stream: self._after[tp] for stream, tp in by_stream.items()}
        block_ms = max(1, int(min(timeout_s, self._settings.socket_timeout_s / 2) * 1000))
        reply: Any = await self._client.xread(
            streams, count=max(1, max_messages // len(streams)), block=block_ms
        )
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
