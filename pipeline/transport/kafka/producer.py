"""Idempotent, keyed Kafka producer whose deliveries are awaitables.

librdkafka runs its own I/O threads. Its delivery reports are served on the event loop that
sends: while a send waits for its acknowledgement, a task polls the producer every
``_REPORTS_S`` without blocking (``poll(0)``) and settles the batches whose reports all came, so
a burst of sends costs one poll per interval, not a wake-up per message. With nothing
outstanding it polls every ``_IDLE_S`` for librdkafka's logs and errors.

A fatal error (librdkafka's idempotent producer can meet one, such as a sequence gap it cannot
repair) leaves the client unusable: every later send would fail with it. The first send that
meets it replaces the client with a new one (logged), keeps serving the old one's reports until
the messages it held have failed, and fails its own batch; senders retry a failed send as they
do a broker outage, so nothing more is lost than that batch's first attempt.

Why not a thread blocked in ``poll``: each report it serves takes the interpreter's lock from
the event loop's thread and writes to the loop's self-pipe, and on a busy consumer those
hand-overs cost more than the sends themselves (a lane with 1 % of its messages failing once,
each failure one send to a retry tier, ran about 5 % slower with the thread).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as _RawProducer

from pipeline.config import KafkaSettings
from pipeline.envelope import Delivered, Record
from pipeline.errors import TransportError
from pipeline.transport.kafka.detached import detached
from pipeline.transport.kafka.errors import client_config_error, translate
from pipeline.transport.kafka.group import client_properties
from pipeline.transport.limits import (
    COPY_HEADROOM_BYTES,
    check_partitions,
    check_sizes,
    missing_partition,
)

log = logging.getLogger(__name__)

_REPORTS_S = 0.001
"""How often delivery reports are served while a send waits (``linger.ms`` is 2)."""
_IDLE_S = 0.25
"""How often librdkafka's logs and errors are served while no send waits."""
_FLUSH_SLICE_S = 0.05


def producer_config(settings: KafkaSettings, max_message_bytes: int) -> dict[str, Any]:
    """The librdkafka properties of the pipeline's producer (its client properties override them).

    Those of ``settings.client`` that apply to a producer (:func:`.group.client_properties`).
    """
    return {
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": settings.client_id,
        "enable.idempotence": True,  # implies acks=all and ordered, de-duplicated retries
        "acks": "all",
        "partitioner": "murmur2_random",  # the Java client's placement for keyed messages
        "linger.ms": 2,
        # Retry and dead-letter copies carry the router's bounded headers on top of a message
        # the main topic took; their topics take that much more (pipeline/topics/admin.py).
        "message.max.bytes": max_message_bytes + COPY_HEADROOM_BYTES,
        "message.timeout.ms": max(settings.request_timeout_ms * 3, 30_000),
        "socket.timeout.ms": settings.request_timeout_ms,
        # An undeclared topic is UnknownTopic, never one made with the broker's defaults
        # (librdkafka's producer asks for auto-creation unless told not to).
        "allow.auto.create.topics": False,
        "logger": logging.getLogger("pipeline.librdkafka"),
        **client_properties(settings, "producer"),
    }


def _is_fatal(err: object) -> bool:
    """Whether ``err`` is a fatal error: the client that raised it can send nothing more."""
    return isinstance(err, KafkaError) and (
        err.fatal() or err.code() == KafkaError._FATAL  # noqa: SLF001
    )


class _Batch:
    """Collects the delivery reports of one batch; resolves its future when all have arrived."""

    __slots__ = ("fatal", "future", "lock", "remaining", "reports")

    def __init__(self, future: asyncio.Future[list[Delivered]], size: int) -> None:
        self.future = future
        self.lock = threading.Lock()
        self.remaining = size
        self.reports: list[Any] = [None] * size
        self.fatal: KafkaError | None = None

    def on_delivery(self, index: int, err: KafkaError | None, msg: Any) -> bool:
        """Record one report (in whichever thread polled); True when the batch is complete."""
        self.reports[index] = (err, msg)
        if err is not None and _is_fatal(err):
            self.fatal = err
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
            problem = client_config_error(exc, settings.client)
            raise problem or translate(exc, "create producer") from None
        self._known_topics: dict[str, int] = {}
        """Partition counts of the topics this producer checked."""
        self._checks: dict[str, asyncio.Future[None]] = {}
        self._lock = threading.Lock()  # a flush in a worker thread also serves reports
        self._complete: list[_Batch] = []
        self._closed = False
        self._outstanding = 0
        """Batches sent and not yet settled."""
        self._reports: asyncio.Task[None] | None = None
        self._idle: asyncio.Future[None] | None = None
        self._retired: list[Any] = []
        """Clients replaced after a fatal error, served until the messages they held failed."""
        self.replaced = 0
        """How many times a fatal error replaced the client."""

    def _on_delivery(self, batch: _Batch, index: int, err: KafkaError | None, msg: Any) -> None:
        if batch.on_delivery(index, err, msg):
            with self._lock:
                self._complete.append(batch)

    def _hand_over(self) -> None:
        """Settle the batches whose reports all came, each on its own event loop."""
        with self._lock:
            done, self._complete = self._complete, []
        if not done:
            return
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for batch in done:
            loop = batch.future.get_loop()
            if loop is here:
                batch.settle()
            elif not loop.is_closed():  # sent from a loop that is not running here
                loop.call_soon_threadsafe(batch.settle)
            # A batch of a closed loop (a send cut short when its loop ended) has nobody waiting.

    def _serve_reports(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make sure a task of ``loop`` serves the delivery reports; wake it if it idles."""
        task = self._reports
        if task is None or task.done() or task.get_loop() is not loop:
            self._reports = loop.create_task(self._reports_forever(), name="kafka-producer")
        else:
            _wake(self._idle)

    def _poll(self) -> None:
        """Run the delivery callbacks of the reports that came, here (old clients' too)."""
        self._raw.poll(0)
        if self._retired:
            for old in self._retired:
                old.poll(0)
            self._retired = [old for old in self._retired if len(old)]

    def _replace(self, failed: Any, error: KafkaError) -> None:
        """``failed`` met a fatal error: send through a new client from now on (once)."""
        if self._raw is not failed:
            return  # another batch of the same client replaced it already
        log.error(
            "the Kafka producer met a fatal error (%s); a new producer replaces it, and the "
            "sends it held fail and are made again by their senders",
            error.str(),
        )
        self._raw = _RawProducer(producer_config(self._settings, self._max_message_bytes))
        self._retired.append(failed)
        self.replaced += 1

    async def _reports_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            try:
                self._poll()
            except Exception:  # a callback's error: the sends waiting must still settle
                log.exception("serving the Kafka producer's delivery reports failed")
            self._hand_over()
            if self._outstanding:
                await asyncio.sleep(_REPORTS_S)
                continue
            idle = self._idle = loop.create_future()
            timer = loop.call_later(_IDLE_S, _wake, idle)
            try:
                await idle
            finally:
                timer.cancel()
                self._idle = None

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
            meta = await detached(self._raw.list_topics, topic, timeout_s)
        except KafkaException as exc:
            raise translate(exc, f"produce to {topic!r}") from exc
        found = meta.topics.get(topic)
        if found is None or found.error is not None:
            error = found.error if found else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            raise translate(error, f"produce to {topic!r}")
        self._known_topics[topic] = len(found.partitions)

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
        if missing_partition(records, self._known_topics[topic]) is not None:
            await self._ensure_topic(topic)  # grown since it was checked, perhaps: ask again
            check_partitions(topic, records, self._known_topics[topic])
        if not records:
            return []
        loop = asyncio.get_running_loop()
        batch = _Batch(loop.create_future(), len(records))
        raw = self._raw
        produce = raw.produce
        try:
            for index, record in enumerate(records):
                kwargs: dict[str, Any] = {
                    "key": record.key,
                    "on_delivery": partial(self._on_delivery, batch, index),
                }
                if record.headers:
                    kwargs["headers"] = list(record.headers.items())
                if record.partition is not None:
                    kwargs["partition"] = record.partition
                try:
                    produce(topic, record.value, **kwargs)
                except BufferError:
                    await self._produce_when_room(raw, topic, record.value, kwargs)
        except KafkaException as exc:
            self._fatal_on_produce(raw, exc)
            raise translate(exc, f"produce to {topic!r}") from exc
        self._outstanding += 1
        self._serve_reports(loop)
        return await self._settled(batch, raw)

    async def _produce_when_room(
        self, raw: Any, topic: str, value: bytes, kwargs: dict[str, Any]
    ) -> None:
        """The local queue is full: wait for deliveries to drain it, then hand the record over."""
        while True:
            await asyncio.to_thread(raw.flush, _FLUSH_SLICE_S)
            self._hand_over()
            try:
                raw.produce(topic, value, **kwargs)
                break
            except BufferError:
                continue

    def _fatal_on_produce(self, raw: Any, exc: KafkaException) -> None:
        """A send refused with a fatal error replaces the client; the caller sends again.

        Records of the batch already handed over fail with the old client, into a batch nobody
        waits for any more.
        """
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and _is_fatal(error):
            self._replace(raw, error)

    async def _settled(self, batch: _Batch, raw: Any) -> list[Delivered]:
        """Wait for ``batch``'s reports; replace ``raw`` if one of them was a fatal error."""
        try:
            return await batch.future
        finally:
            self._outstanding -= 1
            if batch.fatal is not None:
                self._replace(raw, batch.fatal)

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every message sent so far is acknowledged.

        It waits in slices of ``_FLUSH_SLICE_S``: a flush cancelled (a close its caller bounds)
        stops at once, instead of leaving a thread blocked in librdkafka, which holds the
        process's exit, for the rest of ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            slice_s = min(_FLUSH_SLICE_S, max(0.0, deadline - time.monotonic()))
            remaining = await asyncio.to_thread(self._raw.flush, slice_s)
            if not remaining or time.monotonic() >= deadline:
                break
        for old in self._retired:  # they hold only messages failing with the fatal error
            await asyncio.to_thread(old.flush, _FLUSH_SLICE_S)
        self._retired = [old for old in self._retired if len(old)]
        self._hand_over()
        if remaining:
            raise TransportError(f"{remaining} messages still unacknowledged after {timeout_s}s")

    async def close(self) -> None:
        """Flush, then stop serving delivery reports.

        A task serving them on another event loop (sends made there) ends by itself within
        ``_IDLE_S``.
        """
        try:
            await self.flush()
        finally:
            self._closed = True
            task, self._reports = self._reports, None
            if (
                task is not None
                and not task.done()
                and task.get_loop() is asyncio.get_running_loop()
            ):
                _wake(self._idle)
                await asyncio.wait([task])
            self._hand_over()


def _wake(idle: asyncio.Future[None] | None) -> None:
    """End the report task's idle wait, if it is waiting."""
    if idle is not None and not idle.done():
        idle.set_result(None)
