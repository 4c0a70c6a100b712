"""Idempotent, keyed Kafka producer whose deliveries are awaitables.

librdkafka runs its own I/O threads; a poller thread serves delivery reports and hands each batch
of settled futures to the event loop with one ``call_soon_threadsafe``, so a burst of sends costs
one loop wake-up per poll, not per message.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as _RawProducer

from pipeline.config import KafkaSettings
from pipeline.envelope import Delivered, Record
from pipeline.errors import TransportError
from pipeline.transport.kafka.errors import client_config_error, translate
from pipeline.transport.limits import check_sizes

_POLL_S = 0.05


def producer_config(settings: KafkaSettings, max_message_bytes: int) -> dict[str, Any]:
    """The librdkafka properties of the pipeline's producer (settings.client overrides them)."""
    return {
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": settings.client_id,
        "enable.idempotence": True,  # implies acks=all and ordered, de-duplicated retries
        "acks": "all",
        "partitioner": "murmur2_random",  # the Java client's placement for keyed messages
        "linger.ms": 2,
        "message.max.bytes": max_message_bytes,
        "message.timeout.ms": max(settings.request_timeout_ms * 3, 30_000),
        "socket.timeout.ms": settings.request_timeout_ms,
        "logger": logging.getLogger("pipeline.librdkafka"),
        **settings.client,
    }


class _Batch:
    """Collects the delivery reports of one batch; resolves its future when all have arrived."""

    __slots__ = ("future", "lock", "remaining", "reports")

    def __init__(self, future: asyncio.Future[list[Delivered]], size: int) -> None:
        self.future = future
        self.lock = threading.Lock()
        self.remaining = size
        self.reports: list[Any] = [None] * size

    def on_delivery(self, index: int, err: KafkaError | None, msg: Any) -> bool:
        """Record one report (librdkafka thread); True when the batch is complete."""
        self.reports[index] = (err, msg)
        with self.lock:
            self.remaining -= 1
            return self.remaining == 0

    def settle(self) -> None:
        """Resolve the future (event loop thread)."""
        if self.future.done():
            return
        out = []
        for err, msg in self.reports:
            if err is not None:
                self.future.set_exception(translate(err, f"produce to {msg.topic()!r}"))
                return
            out.append(Delivered(msg.topic(), msg.partition(), msg.offset()))
        self.future.set_result(out)


class KafkaProducer:
    """A :class:`~pipeline.transport.protocol.Producer` on confluent-kafka."""

    def __init__(self, settings: KafkaSettings, max_message_bytes: int) -> None:
        """Create the producer; the connection opens lazily on the first send."""
        self._settings = settings
        self._max_message_bytes = max_message_bytes
        try:
            self._raw = _RawProducer(producer_config(settings, max_message_bytes))
        except KafkaException as exc:
            raise client_config_error(exc) or translate(exc, "create producer") from None
        self._known_topics: set[str] = set()
        self._checks: dict[str, asyncio.Future[None]] = {}
        self._lock = threading.Lock()
        self._complete: list[_Batch] = []
        self._closed = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poller = threading.Thread(
            target=self._poll_forever, name="kafka-producer", daemon=True
        )
        self._poller.start()

    def _poll_forever(self) -> None:
        while not self._closed.is_set():
            self._raw.poll(_POLL_S)
            self._hand_over()

    def _on_delivery(self, batch: _Batch, index: int, err: KafkaError | None, msg: Any) -> None:
        if batch.on_delivery(index, err, msg):
            with self._lock:
                self._complete.append(batch)

    def _hand_over(self) -> None:
        with self._lock:
            done, self._complete = self._complete, []
        if done and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_settle_all, done)

    async def _ensure_topic(self, topic: str) -> None:
        """Fail fast on an unknown topic instead of waiting for librdkafka's metadata timeout.

        Concurrent first sends to one topic share a single metadata request.
        """
        check = self._checks.get(topic)
        if check is None:
            check = asyncio.ensure_future(self._check_topic(topic))
            self._checks[topic] = check
            check.add_done_callback(lambda _: self._checks.pop(topic, None))
        await asyncio.shield(check)

    async def _check_topic(self, topic: str) -> None:
        timeout_s = self._settings.request_timeout_ms / 1000
        try:
            meta = await asyncio.to_thread(self._raw.list_topics, topic, timeout_s)
        except KafkaException as exc:
            raise translate(exc, f"produce to {topic!r}") from exc
        found = meta.topics.get(topic)
        if found is None or found.error is not None:
            error = found.error if found else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            raise translate(error, f"produce to {topic!r}")
        self._known_topics.add(topic)

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Delivered:
        """Produce one message and wait for the broker's acknowledgement (``acks=all``)."""
        (delivered,) = await self.send_many(topic, [Record(value, key, headers, partition)])
        return delivered

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        """Produce ``records`` in order; resolves when every one is acknowledged."""
        check_sizes(records, self._max_message_bytes)
        if topic not in self._known_topics:
            await self._ensure_topic(topic)
        if not records:
            return []
        loop = asyncio.get_running_loop()
        self._loop = loop
        batch = _Batch(loop.create_future(), len(records))
        produce = self._raw.produce
        for index, record in enumerate(records):
            kwargs: dict[str, Any] = {
                "key": record.key,
                "on_delivery": partial(self._on_delivery, batch, index),
            }
            if record.headers:
                kwargs["headers"] = list(record.headers.items())
            if record.partition is not None:
                kwargs["partition"] = record.partition
            while True:
                try:
                    produce(topic, record.value, **kwargs)
                    break
                except BufferError:
                    # The local queue is full: wait for deliveries to drain it (backpressure).
                    await asyncio.to_thread(self._raw.flush, _POLL_S)
                except KafkaException as exc:
                    raise translate(exc, f"produce to {topic!r}") from exc
        return await batch.future

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every message sent so far is acknowledged."""
        remaining = await asyncio.to_thread(self._raw.flush, timeout_s)
        self._hand_over()
        if remaining:
            raise TransportError(f"{remaining} messages still unacknowledged after {timeout_s}s")

    async def close(self) -> None:
        """Flush, then stop the poller thread."""
        try:
            await self.flush()
        finally:
            self._closed.set()
            await asyncio.to_thread(self._poller.join)
            self._hand_over()
            await asyncio.sleep(0)  # let the final hand-over settle its futures


def _settle_all(batches: list[_Batch]) -> None:
    for batch in batches:
        batch.settle()
