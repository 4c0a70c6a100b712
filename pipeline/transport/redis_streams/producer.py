"""Keyed producer for Redis Streams with automatic pipelining.

Sends issued while a pipeline is in flight queue up and go out together in the next one, so a
burst costs one round trip per batch while each ``send`` still resolves on its own
acknowledgement. One pipeline is in flight at a time, so messages reach Redis in ``send`` order.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from typing import Any

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline.envelope import Delivered
from pipeline.errors import DeliveryFailed, MessageTooLarge
from pipeline.transport.partitioner import partition_for
from pipeline.transport.redis_streams.admin import TopicMeta, read_meta
from pipeline.transport.redis_streams.errors import translate
from pipeline.transport.redis_streams.functions import Functions
from pipeline.transport.redis_streams.keys import Keys

_MAX_BATCH = 1_000
_META_TTL_S = 5.0
_Pending = tuple[str, int, list[Any], asyncio.Future[Delivered]]


def encode_fields(
    key: bytes | None, value: bytes, headers: Mapping[str, bytes] | None
) -> list[Any]:
    """Stream entry fields: ``k`` key (absent for None), ``v`` value, ``h.<name>`` headers."""
    fields: list[Any] = [] if key is None else ["k", key]
    fields += ["v", value]
    for name, raw in (headers or {}).items():
        fields += [f"h.{name}", raw]
    return fields


class RedisStreamsProducer:
    """A :class:`~pipeline.transport.protocol.Producer` on Redis Streams."""

    def __init__(
        self,
        client: Redis,
        keys: Keys,
        functions: Functions,
        max_message_bytes: int,
        default_max_len: int,
    ) -> None:
        """Use the transport's shared client."""
        self._client = client
        self._keys = keys
        self._functions = functions
        self._max_message_bytes = max_message_bytes
        self._default_max_len = default_max_len
        self._meta: dict[str, tuple[float, TopicMeta]] = {}
        self._lookups: dict[str, asyncio.Future[TopicMeta]] = {}
        self._queue: list[_Pending] = []
        self._drainer: asyncio.Task[None] | None = None

    async def _topic(self, topic: str) -> TopicMeta:
        """The topic's metadata, cached; concurrent misses share one lookup."""
        cached = self._meta.get(topic)
        if cached and time.monotonic() - cached[0] < _META_TTL_S:
            return cached[1]
        lookup = self._lookups.get(topic)
        if lookup is None:
            lookup = asyncio.ensure_future(
                read_meta(self._client, self._keys, topic, self._default_max_len)
            )
            self._lookups[topic] = lookup
            lookup.add_done_callback(lambda _: self._lookups.pop(topic, None))
        meta = await asyncio.shield(lookup)
        self._meta[topic] = (time.monotonic(), meta)
        return meta

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Delivered:
        """Append one message to its partition's stream and wait for Redis to acknowledge it."""
        size = (
            len(value) + len(key or b"") + sum(len(k) + len(v) for k, v in (headers or {}).items())
        )
        if size > self._max_message_bytes:
            raise MessageTooLarge(
                f"message of {size} bytes exceeds max_message_bytes={self._max_message_bytes}"
            )
        meta = await self._topic(topic)
        if partition is None:
            partition = (
                partition_for(key, meta.partitions)
                if key is not None
                else random.randrange(meta.partitions)
            )
        elif not 0 <= partition < meta.partitions:
            raise DeliveryFailed(f"topic {topic!r} has no partition {partition}")
        future: asyncio.Future[Delivered] = asyncio.get_running_loop().create_future()
        self._queue.append((topic, partition, encode_fields(key, value, headers), future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:_MAX_BATCH], self._queue[_MAX_BATCH:]
            calls = []
            for topic, partition, fields, _ in batch:
                meta = self._meta[topic][1]
                keys = [self._keys.stream(topic, partition), self._keys.sequence(topic, partition)]
                calls.append((keys, [meta.max_len, *fields]))
            try:
                results = await self._functions.produce_batch(calls)
            except rexc.RedisError as exc:
                error = translate(exc, "produce")
                for *_, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (topic, partition, _, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(DeliveryFailed(f"produce to {topic!r}: {result}"))
                else:
                    future.set_result(Delivered(topic, partition, int(result[0])))

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every queued message is acknowledged."""
        if self._drainer is not None:
            await asyncio.wait_for(asyncio.shield(self._drainer), timeout_s)

    async def close(self) -> None:
        """Flush; the client belongs to the transport."""
        await self.flush()
