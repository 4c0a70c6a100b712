"""Keyed producer for Redis Streams with automatic pipelining.

Sends issued while a pipeline is in flight queue up and go out together in the next one, so a
burst costs one round trip per batch while each ``send`` still resolves on its own
acknowledgement. Consecutive messages for one partition travel in one ``pl_produce`` call. One
pipeline is in flight at a time, so messages reach Redis in ``send`` order.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline.envelope import Delivered, Record
from pipeline.errors import BrokerUnavailable, DeliveryFailed
from pipeline.transport.limits import check_partitions, check_sizes, missing_partition
from pipeline.transport.partitioner import partition_for
from pipeline.transport.redis_streams.admin import TopicMeta, read_meta
from pipeline.transport.redis_streams.errors import (
    FULL,
    is_full,
    is_wrong_type,
    translate,
    wrong_type_of_partition,
)
from pipeline.transport.redis_streams.functions import Functions
from pipeline.transport.redis_streams.keys import Keys

_MAX_BATCH = 1_000
_META_TTL_S = 5.0
"""How long a topic's metadata (partitions, max_len) is used before it is read again: a
``max_len`` that ``pipeline topics apply`` changed trims from the sends after that."""


def encode_fields(record: Record) -> list[Any]:
    """Stream entry fields: ``k`` key (absent for None), ``v`` value, ``h.<name>`` headers."""
    fields: list[Any] = [] if record.key is None else ["k", record.key]
    fields += ["v", record.value]
    if record.headers:
        for name, raw in record.headers.items():
            fields += [f"h.{name}", raw]
    return fields


@dataclass(slots=True)
class _Run:
    """Consecutive messages of one partition, sent by one ``pl_produce`` call."""

    topic: str
    partition: int
    max_len: int
    fields: list[list[Any]]
    future: asyncio.Future[int]  # resolves to the first offset


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
        self._queue: list[_Run] = []
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

    def _partition(self, meta: TopicMeta, record: Record) -> int:
        if record.partition is None:
            if record.key is None:
                return random.randrange(meta.partitions)
            return partition_for(record.key, meta.partitions)
        return record.partition

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
        (delivered,) = await self.send_many(topic, [Record(value, key, headers, partition)])
        return delivered

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        """Append ``records`` in order; one ``pl_produce`` per run of one partition."""
        check_sizes(records, self._max_message_bytes)
        meta = await self._topic(topic)
        if missing_partition(records, meta.partitions) is not None:
            self._meta.pop(topic, None)  # grown since it was cached, perhaps: read it again
            meta = await self._topic(topic)
            check_partitions(topic, records, meta.partitions)
        loop = asyncio.get_running_loop()
        runs: list[_Run] = []
        placed: list[tuple[_Run, int]] = []  # (run, index within the run) per record
        open_runs: dict[int, _Run] = {}
        for record in records:
            partition = self._partition(meta, record)
            run = open_runs.get(partition)
            if run is None or len(run.fields) >= _MAX_BATCH:
                run = _Run(topic, partition, meta.max_len, [], loop.create_future())
                open_runs[partition] = run
                runs.append(run)
            placed.append((run, len(run.fields)))
            run.fields.append(encode_fields(record))
        self._queue.extend(runs)
        if runs and (self._drainer is None or self._drainer.done()):
            self._drainer = asyncio.create_task(self._drain())
        firsts = await asyncio.gather(*(run.future for run in runs))
        first_of = {id(run): first for run, first in zip(runs, firsts, strict=True)}
        return [Delivered(topic, run.partition, first_of[id(run)] + i) for run, i in placed]

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:_MAX_BATCH], self._queue[_MAX_BATCH:]
            calls = []
            for run in batch:
                args: list[Any] = [run.max_len, len(run.fields)]
                for fields in run.fields:
                    args.append(len(fields))
                    args += fields
                keys = [
                    self._keys.stream(run.topic, run.partition),
                    self._keys.sequence(run.topic, run.partition),
                ]
                calls.append((keys, args))
            try:
                results = await self._functions.produce_batch(calls)
                for run, result in zip(batch, results, strict=True):
                    if run.future.done():
                        continue
                    if isinstance(result, Exception):
                        error = self._refused(run, result)
                        run.future.set_exception(error)
                    else:
                        run.future.set_result(int(result[0]))
            except rexc.RedisError as exc:
                _fail(batch, translate(exc, "produce"))
            except OSError as exc:  # a socket error the client let through
                _fail(batch, BrokerUnavailable(f"produce: redis unreachable: {exc}"))
            except Exception as exc:  # a bug: the batch's sends raise it rather than wait forever
                _fail(batch, exc)

    def _refused(self, run: _Run, reply: Exception) -> DeliveryFailed:
        """The error of a send ``pl_produce`` refused with ``reply``."""
        why = str(reply)
        if is_full(why):
            why = FULL
        elif is_wrong_type(why):  # another program wrote one of the partition's two keys
            why = wrong_type_of_partition(
                self._keys.stream(run.topic, run.partition),
                self._keys.sequence(run.topic, run.partition),
            )
        return DeliveryFailed(f"produce to {run.topic!r}: {why}")

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every queued message is acknowledged."""
        if self._drainer is not None:
            await asyncio.wait_for(asyncio.shield(self._drainer), timeout_s)

    async def close(self) -> None:
        """Flush; the client belongs to the transport."""
        await self.flush()


def _fail(runs: Sequence[_Run], error: Exception) -> None:
    """Fail every send of ``runs`` still waiting with ``error``."""
    for run in runs:
        if not run.future.done():
            run.future.set_exception(error)
