"""``PIPELINE_KAFKA__CLIENT`` properties reach only the kinds of client they apply to."""

from __future__ import annotations

import logging

import pytest
from contract.helpers import consume_until, make_topic

from pipeline.config import Settings
from pipeline.errors import ConfigError
from pipeline.transport.kafka.group import admin_client, admin_config, consumer_config
from pipeline.transport.kafka.producer import KafkaProducer, producer_config
from pipeline.transport.kafka.transport import KafkaTransport

pytestmark = pytest.mark.usefixtures("kafka_service")

CONSUMER_ONLY = {"max.poll.interval.ms": "600000", "fetch.min.bytes": "1"}
PRODUCER_ONLY = {"linger.ms": "5", "compression.type": "lz4", "acks": "all"}
BOTH = {"socket.keepalive.enable": "true"}


def with_client(settings: Settings, client: dict[str, str], **kafka: object) -> Settings:
    """The test settings with these client properties (and Kafka settings)."""
    section = settings.kafka.model_copy(update={"client": client, **kafka})
    return settings.model_copy(update={"kafka": section})


def confwarns(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The lines in which librdkafka says a property does not apply to the client given it."""
    return [r.getMessage() for r in caplog.records if "CONFWARN" in r.getMessage()]


async def test_each_client_is_built_with_its_own_kind_of_properties_and_warns_of_none(
    settings: Settings, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A producer, a member and an admin client of one configuration log no CONFWARN line."""
    tuned = with_client(settings, {**CONSUMER_ONLY, **PRODUCER_ONLY, **BOTH})
    transport = KafkaTransport(tuned)
    topic = f"kinds_{unique}"
    await make_topic(transport, topic, 1)
    caplog.set_level(logging.INFO, logger="pipeline.librdkafka")
    producer = transport.producer()
    try:
        await producer.send(topic, b"v", key=b"k")
    finally:
        await producer.close()
    consumer = transport.consumer(f"g-{unique}", [topic])
    try:
        received = await consume_until(consumer, lambda got: len(got) == 1)
    finally:
        await consumer.close()
    admin_client(tuned.kafka).poll(0)
    await transport.close()
    assert [m.value for m in received] == [b"v"]
    assert confwarns(caplog) == []
    member = consumer_config(tuned.kafka, "g", "m")
    made = producer_config(tuned.kafka, 1_000_000)
    admin = admin_config(tuned.kafka)
    assert member.items() >= {**CONSUMER_ONLY, **BOTH}.items()
    assert made.items() >= {**PRODUCER_ONLY, **BOTH}.items()
    assert admin.items() >= BOTH.items()
    assert not member.keys() & PRODUCER_ONLY.keys()
    assert not made.keys() & CONSUMER_ONLY.keys()
    assert not admin.keys() & {**CONSUMER_ONLY, **PRODUCER_ONLY}.keys()


async def test_a_consumer_property_reaches_the_member_and_spares_the_producer(
    settings: Settings, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``max.poll.interval.ms`` below the session timeout is refused by the member alone."""
    tuned = with_client(settings, {"max.poll.interval.ms": "1000"}, group_protocol="classic")
    transport = KafkaTransport(tuned)
    topic = f"kinds_{unique}"
    await make_topic(transport, topic, 1)
    caplog.set_level(logging.INFO, logger="pipeline.librdkafka")
    producer = transport.producer()
    try:
        await producer.send(topic, b"v", key=b"k")
    finally:
        await producer.close()
    consumer = transport.consumer(f"g-{unique}", [topic])
    try:
        with pytest.raises(ConfigError, match=r"^PIPELINE_KAFKA__CLIENT: .*max\.poll\.interval"):
            await consumer.poll(10, 0.2)
    finally:
        await consumer.close()
        await transport.close()
    assert confwarns(caplog) == []


def test_a_producer_property_reaches_the_producer_alone(settings: Settings) -> None:
    """A malformed ``linger.ms`` fails the producer; members and admin clients never get it."""
    tuned = with_client(settings, {"linger.ms": "soon"})
    with pytest.raises(ConfigError, match=r"^PIPELINE_KAFKA__CLIENT: .*\"linger\.ms\""):
        KafkaProducer(tuned.kafka, 1_000_000)
    admin_client(tuned.kafka)
    assert "linger.ms" not in consumer_config(tuned.kafka, "g", "m")


def test_a_property_no_client_knows_still_fails_every_kind(settings: Settings) -> None:
    """A misspelt property is passed to every client, so each refuses it with one line."""
    tuned = with_client(settings, {"max.pol.interval.ms": "600000"})
    with pytest.raises(ConfigError, match=r"^PIPELINE_KAFKA__CLIENT: .*max\.pol\.interval\.ms"):
        KafkaProducer(tuned.kafka, 1_000_000)
    with pytest.raises(ConfigError, match=r"^PIPELINE_KAFKA__CLIENT: .*max\.pol\.interval\.ms"):
        admin_client(tuned.kafka)
    assert consumer_config(tuned.kafka, "g", "m")["max.pol.interval.ms"] == "600000"


@pytest.mark.parametrize(
    ("client", "named"),
    [
        ({"linger.ms": "soon"}, "linger.ms"),
        ({"acks": "many"}, "acks"),
        ({"compression.type": "zip"}, "compression.type"),
        ({"retries": "-1"}, "retries"),
        ({"max.in.flight": "0"}, "max.in.flight"),
        ({"delivery.timeout.ms": "1"}, "delivery.timeout.ms"),
    ],
)
def test_a_producer_alias_is_refused_in_one_line_under_the_name_written(
    settings: Settings, client: dict[str, str], named: str
) -> None:
    """A bad alias (linger.ms) is named as written, not as librdkafka's property, on one line."""
    with pytest.raises(ConfigError) as refused:
        KafkaProducer(with_client(settings, client).kafka, 1_000_000)
    line = str(refused.value)
    assert line.startswith("PIPELINE_KAFKA__CLIENT: ")
    assert f'"{named}"' in line or f"`{named}`" in line, line
    assert "\n" not in line
    assert "Failed to create" not in line


async def test_a_member_alias_is_refused_under_the_name_written(
    settings: Settings, unique: str
) -> None:
    """A malformed max.partition.fetch.bytes stops the member with a line naming it so."""
    tuned = with_client(settings, {"max.partition.fetch.bytes": "lots"}, group_protocol="classic")
    transport = KafkaTransport(tuned)
    topic = f"kinds_{unique}"
    await make_topic(transport, topic, 1)
    consumer = transport.consumer(f"g-{unique}", [topic])
    try:
        with pytest.raises(ConfigError, match=r'"max\.partition\.fetch\.bytes"'):
            await consumer.poll(10, 0.2)
    finally:
        await consumer.close()
        await transport.close()


async def test_a_bad_consumer_property_fails_a_lag_read_with_one_line(
    settings: Settings, unique: str
) -> None:
    """A lag read (status, the ingress's backlog) given a malformed consumer property: one line."""
    transport = KafkaTransport(with_client(settings, {"fetch.min.bytes": "lots"}))
    topic = f"kinds_{unique}"
    await make_topic(transport, topic, 1)
    try:
        with pytest.raises(ConfigError, match=r'^PIPELINE_KAFKA__CLIENT: .*"fetch\.min\.bytes"'):
            await transport.admin().group_lag(f"g-{unique}", topic)
    finally:
        await transport.close()
