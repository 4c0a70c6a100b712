"""The Kafka producer's delivery reports, served on the event loop that sends."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from contract.helpers import make_topic

from pipeline.config import Settings
from pipeline.envelope import Delivered, Record
from pipeline.errors import DeliveryFailed
from pipeline.transport import create_transport
from pipeline.transport.kafka.producer import KafkaProducer, producer_config


async def test_a_burst_of_sends_settles_in_order_and_close_leaves_no_task_or_thread(
    settings: Settings, kafka_service: str, unique: str
) -> None:
    """Concurrent sends all resolve with their offsets; after close nothing keeps serving."""
    transport = create_transport(settings, "kafka")
    topic = f"reports_{unique}"
    await make_topic(transport, topic, 1)
    threads_before = {t.ident for t in threading.enumerate()}
    producer = transport.producer()
    try:
        single = [producer.send(topic, f"v{i}".encode(), key=b"k") for i in range(50)]
        many = producer.send_many(topic, [Record(f"m{i}".encode(), b"k") for i in range(20)])
        delivered = await asyncio.gather(*single)
        batch = await many
        serving = [t.name for t in threading.enumerate() if t.ident not in threads_before]
        assert "kafka-producer" not in serving, "reports are served on the loop, not a thread"
    finally:
        await producer.close()
    offsets = [d.offset for d in delivered]
    assert sorted(offsets) == list(range(min(offsets), min(offsets) + 50))
    assert [d.offset for d in batch] == sorted(d.offset for d in batch)
    assert len({*offsets, *(d.offset for d in batch)}) == 70
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "kafka-producer"]
    left = [t.name for t in threading.enumerate() if t.ident not in threads_before]
    assert "kafka-producer" not in left
    await transport.close()


def test_a_producer_sends_again_from_an_event_loop_started_after_the_first_closed(
    settings: Settings, kafka_service: str, unique: str
) -> None:
    """Reports are served on whichever loop sends: a second ``asyncio.run`` is not left waiting."""
    transport = create_transport(settings, "kafka")
    topic = f"reloop_{unique}"
    asyncio.run(make_topic(transport, topic, 1))
    producer = transport.producer()
    assert isinstance(producer, KafkaProducer)

    async def send(value: bytes) -> Delivered:
        return await asyncio.wait_for(producer.send(topic, value, key=b"k"), 30)

    first = asyncio.run(send(b"first"))
    second = asyncio.run(send(b"second"))
    asyncio.run(producer.close())
    asyncio.run(transport.close())
    assert second.offset == first.offset + 1


async def test_an_error_while_serving_reports_is_logged_and_the_send_still_settles(
    settings: Settings, kafka_service: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A delivery callback that raises (here: the first poll) does not strand waiting sends."""
    transport = create_transport(settings, "kafka")
    topic = f"pollfail_{unique}"
    await make_topic(transport, topic, 1)
    producer = transport.producer()
    assert isinstance(producer, KafkaProducer)
    real = producer._raw  # the librdkafka client, with one failure injected

    class FirstPollFails:
        failed = False

        def poll(self, timeout: float) -> int:
            if not self.failed:
                self.failed = True
                raise RuntimeError("a delivery callback failed")
            return int(real.poll(timeout))

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    producer._raw = FirstPollFails()  # type: ignore[assignment]
    try:
        delivered = await asyncio.wait_for(producer.send(topic, b"v", key=b"k"), 30)
    finally:
        await producer.close()
    assert delivered.offset >= 0
    assert "serving the Kafka producer's delivery reports failed" in caplog.text
    await transport.close()


def _fatal() -> KafkaError:
    return KafkaError(KafkaError._FATAL, "test: idempotent producer sequence gap", fatal=True)


class _FatalOnce:
    """The librdkafka client, meeting one fatal error: in ``produce`` or in a delivery report."""

    def __init__(self, real: Any, where: str) -> None:
        self.real = real
        self.where = where
        self.met = False

    def produce(self, topic: str, value: bytes, **kwargs: Any) -> None:
        if self.met:
            raise KafkaException(_fatal())  # a client past a fatal error refuses every send
        self.met = True
        if self.where == "produce":
            raise KafkaException(_fatal())
        report = kwargs["on_delivery"]
        kwargs["on_delivery"] = lambda _err, msg: report(_fatal(), msg)
        self.real.produce(topic, value, **kwargs)

    def __len__(self) -> int:
        return len(self.real)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.mark.parametrize("where", ["produce", "report"])
async def test_a_fatal_error_replaces_the_client_and_the_next_send_goes_through(
    settings: Settings,
    kafka_service: str,
    unique: str,
    where: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The send that meets it fails; the next one goes through a new client, to the broker.

    Before, a fatal error (an idempotent producer's unrepairable sequence gap) left the client
    refusing every later send: the ingress and the members could produce nothing until restarted.
    """
    transport = create_transport(settings, "kafka")
    topic = f"fatal_{unique}"
    await make_topic(transport, topic, 1)
    producer = transport.producer()
    assert isinstance(producer, KafkaProducer)
    broken = _FatalOnce(producer._raw, where)
    producer._raw = broken  # type: ignore[assignment]
    try:
        with pytest.raises(DeliveryFailed, match="sequence gap"):
            await asyncio.wait_for(producer.send(topic, b"first", key=b"k"), 30)
        assert producer._raw is not broken
        assert producer.replaced == 1
        delivered = await asyncio.wait_for(producer.send(topic, b"second", key=b"k"), 30)
    finally:
        await producer.close()
    assert delivered.topic == topic
    assert "met a fatal error" in caplog.text
    await transport.close()


def test_the_producer_never_asks_the_broker_to_create_a_topic(settings: Settings) -> None:
    """An undeclared topic is an error, never a topic made with the broker's defaults.

    librdkafka's producer asks for auto-creation unless told not to (its consumer does not),
    and Kafka's brokers allow it by default; the local broker here does not, so the property
    is checked where it is set, on a real client that accepts it.
    """
    config = producer_config(settings.kafka, settings.max_message_bytes)
    assert config["allow.auto.create.topics"] is False
    Producer({k: v for k, v in config.items() if k != "logger"}).flush(0)
