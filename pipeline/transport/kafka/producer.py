"""Idempotent, keyed Kafka producer whose deliveries are awaitables.

librdkafka runs its own I/O threads; a poller thread serves delivery reports and hands each batch
of them to the event loop with one ``call_soon_threadsafe``, so a burst of sends costs one loop
wake-up per batch, not per message.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as _RawProducer

from pipeline.config import KafkaSettings
from pipeline.envelope import Delivered
from pipeline.errors import MessageTooLarge, TransportError
from pipeline.transport.kafka.errors import translate

_POLL_S = 0.05
_Report = tuple[asyncio.Future[Delivered], KafkaError | None, Any]


def producer_config(settings: KafkaSettings, max_message_bytes: int) -> dict[str, Any]:
    """Librdkafka properties of the pipeline's producer (settings.client overrides them)."""
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


class KafkaProducer:
    """A :class:`~pipeline.transport.protocol.Producer` on confluent-kafka."""

    def __init__(self, settings: KafkaSettings, max_message_bytes: int) -> None:
        """Create the producer; the connection opens lazily on the first send."""
        self._settings = settings
        self._max_message_bytes = max_message_bytes
        self._raw = _RawProducer(producer_config(settings, max_message_bytes))
        self._known_topics: set[str] = set()
        self._lock = threading.Lock()
        self._pending: list[_Report] = []
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

    def _hand_over(self) -> None:
        with self._lock:
            reports, self._pending = self._pending, []
        if reports and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_settle, reports)

    async def _check_topic(self, topic: str) -> None:
        """Fail fast on an unknown topic instead of waiting for librdkafka's metadata timeout."""
        timeout_s = self._settings.request_timeout_ms / 1000
        try:
            meta = await asyncio.to_thread(self._raw.list_topics, topic, timeout_s)
        except KafkaException as exc:
            raise translate(exc, f"produce to {topic!r}") from exc
        found = meta.topics.get(topic)
        if found is None or found.error is not None:
            raise translate(
                found.error if found else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART),
                f"produce to {topic!r}",
            )
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
        size = (
            len(value) + len(key or b"") + sum(len(k) + len(v) for k, v in (headers or {}).items())
        )
        if size > self._max_message_bytes:
            raise MessageTooLarge(
                f"message of {size} bytes exceeds max_message_bytes={self._max_message_bytes}"
            )
        if topic not in self._known_topics:
            await self._check_topic(topic)
        loop = asyncio.get_running_loop()
        self._loop = loop
        future: asyncio.Future[Delivered] = loop.create_future()

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            with self._lock:
                self._pending.append((future, err, msg))

        kwargs: dict[str, Any] = {
            "key": key,
            "headers": list((headers or {}).items()),
            "on_delivery": on_delivery,
        }
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self._raw.produce(topic, value, **kwargs)
                break
            except BufferError:
                # The local queue is full: wait for deliveries to drain it (backpressure).
                await asyncio.to_thread(self._raw.flush, _POLL_S)
            except KafkaException as exc:
                raise translate(exc, f"produce to {topic!r}") from exc
        return await future

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


def _settle(reports: list[_Report]) -> None:
    for future, err, msg in reports:
        if future.done():
            continue
        if err is not None:
            future.set_exception(translate(err, f"produce to {msg.topic()!r}"))
        else:
            future.set_result(Delivered(msg.topic(), msg.partition(), msg.offset()))
