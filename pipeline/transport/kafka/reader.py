"""The Kafka :class:`~pipeline.transport.protocol.Reader`: its partitions assigned, in no group.

A member of a group, even of one of its own that never commits, is kept on the broker when its
process is killed (its session, then the empty group, expire minutes later), and its close waits
on the group. A reader assigns itself its topics' partitions instead (librdkafka's ``assign``):
it joins no group and commits nothing, so the broker holds nothing of it, whatever stops it.
librdkafka requires a ``group.id`` even so; a one-off name is given and never used.

Every call into librdkafka runs on one dedicated thread, as for a member
(:mod:`~pipeline.transport.kafka.consumer`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaException
from confluent_kafka import Consumer as _RawConsumer
from confluent_kafka import TopicPartition as _RawTP

from pipeline.config import KafkaSettings
from pipeline.envelope import Message, TopicPartition
from pipeline.errors import TransportError
from pipeline.transport.group_reader import reader_group
from pipeline.transport.kafka.consumer import _FATAL_TOPIC, first_then_fetched, messages_of
from pipeline.transport.kafka.consumer_thread import ConsumerThread
from pipeline.transport.kafka.errors import translate
from pipeline.transport.kafka.group import Protocol, client_error, consumer_config
from pipeline.transport.protocol import StartAt

log = logging.getLogger(__name__)
T = TypeVar("T")


class KafkaReader:
    """A :class:`~pipeline.transport.protocol.Reader` on a consumer assigned its partitions."""

    def __init__(
        self, settings: KafkaSettings, topics: Sequence[str], *, start_at: StartAt = "earliest"
    ) -> None:
        """Keep what to read; the client is built and its partitions assigned at the first poll."""
        self._settings = settings
        self._topics = list(topics)
        self._start_at = start_at
        self._name = reader_group()
        self._worker = ConsumerThread(f"kafka-{self._name}")
        self._raw_consumer: Any = None
        self._closed = False

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.wrap_future(self._worker.submit(fn, *args))

    @property
    def _raw(self) -> Any:
        """The librdkafka consumer, built and assigned on first use (reader thread only)."""
        if self._raw_consumer is None:
            self._raw_consumer = self._open()
        return self._raw_consumer

    def _open(self) -> Any:
        # No group is joined, so the protocol only decides which properties the client takes.
        forced = self._settings.client.get("group.protocol")
        protocol: Protocol = "consumer" if forced == "consumer" else "classic"
        config = consumer_config(self._settings, self._name, self._name, protocol=protocol)
        try:
            raw = _RawConsumer({**config, "auto.offset.reset": self._start_at})
        except KafkaException as exc:
            problem = client_error(exc, protocol, self._settings)
            if problem is not None:
                raise problem from None
            raise translate(exc, "create reader") from exc
        try:
            start = OFFSET_BEGINNING if self._start_at == "earliest" else OFFSET_END
            raw.assign([_RawTP(tp.topic, tp.partition, start) for tp in self._partitions(raw)])
        except BaseException:
            raw.close()
            raise
        return raw

    def _partitions(self, raw: Any) -> list[TopicPartition]:
        """Every partition of the topics read, from the broker's metadata."""
        timeout_s = self._settings.request_timeout_ms / 1000
        out: list[TopicPartition] = []
        for topic in self._topics:
            try:
                found = raw.list_topics(topic, timeout=timeout_s).topics.get(topic)
            except KafkaException as exc:
                raise translate(exc, f"consume {self._topics}") from exc
            if found is not None and found.error is not None and found.error.code() in _FATAL_TOPIC:
                raise translate(found.error, f"consume {self._topics}")
            if found is None or found.error is not None or not found.partitions:
                problem = (
                    found.error.str() if found is not None and found.error else "no partitions"
                )
                raise TransportError(f"consume {self._topics}: metadata of {topic!r}: {problem}")
            out += [TopicPartition(topic, p) for p in sorted(found.partitions)]
        return out

    def _fetch(self, max_messages: int, timeout_s: float) -> list[Any]:
        try:
            return first_then_fetched(self._raw, max_messages, timeout_s, self._worker.pending)
        except KafkaException as exc:
            raise translate(exc, "consume") from exc

    async def poll(self, max_messages: int = 500, timeout_s: float = 1.0) -> list[Message]:
        """The next messages of the assigned partitions; nothing is ever committed."""
        return messages_of(
            await self._call(self._fetch, max_messages, timeout_s), "reader", self._topics
        )

    def _seek(self, raw_tp: Any) -> None:
        self._raw.seek(raw_tp)

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make the next polls of ``tp`` start at ``offset``."""
        try:
            await self._call(self._seek, _RawTP(tp.topic, tp.partition, offset))
        except KafkaException as exc:
            raise translate(exc, f"seek {tp}") from exc

    def _close_open(self) -> None:
        if self._raw_consumer is not None:
            self._raw_consumer.close()

    async def close(self) -> None:
        """Close the client (it is in no group: nothing to leave) and free the thread."""
        if self._closed:
            return
        self._closed = True
        limit_s = self._settings.request_timeout_ms / 1000
        try:
            await asyncio.wait_for(self._call(self._close_open), limit_s)
        except TimeoutError:
            log.warning("reader close did not finish in %.0fs", limit_s)
        finally:
            self._worker.stop()
