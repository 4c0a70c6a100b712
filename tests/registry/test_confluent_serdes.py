"""Avro events through a real Kafka topic, framed by our registry."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer as ConfluentDeserializer
from confluent_kafka.schema_registry.avro import AvroSerializer as ConfluentSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from registry.samples import message
from support import delete_group_after_test, test_settings

from pipeline.registry.client.events import MessageReceivedRecord
from pipeline.registry.client.http import RegistryClient
from pipeline.registry.client.serde import AvroDeserializer, AvroSerializer

SCHEMA = (Path(__file__).resolve().parents[2] / "schemas" / "message_received.avsc").read_text()


def test_round_trip_through_a_kafka_topic(
    kafka_service: str, sqlite_registry_url: str, unique: str
) -> None:
    """Produce confluent- and pipeline-serialized events, consume, and decode both ways."""
    topic = f"registry-{unique}"
    delete_group_after_test(test_settings(), "kafka", f"g-{unique}", [topic])
    admin = AdminClient({"bootstrap.servers": kafka_service})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    confluent = SchemaRegistryClient({"url": sqlite_registry_url, "max.retries": 0})
    ours = RegistryClient(sqlite_registry_url)
    ctx = SerializationContext(topic, MessageField.VALUE)
    try:
        # Idempotent: the assertions below read the two records back in the order produced.
        producer = Producer({"bootstrap.servers": kafka_service, "enable.idempotence": True})
        theirs = ConfluentSerializer(confluent, SCHEMA, to_dict=lambda m, _: m.model_dump())
        mine = AvroSerializer(ours, SCHEMA, f"{topic}-value")
        first = message()
        second = first.model_copy(update={"event_id": "evt-2", "text": "second"})
        producer.produce(topic, key=b"conv-9", value=theirs(first, ctx))
        producer.produce(topic, key=b"conv-9", value=mine(second))
        assert producer.flush(30) == 0

        consumer = Consumer(
            {
                "bootstrap.servers": kafka_service,
                "group.id": f"g-{unique}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe([topic])
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(values) < 2 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
        consumer.close()
        assert len(values) == 2

        confluent_reader = ConfluentDeserializer(
            confluent, from_dict=lambda d, _: MessageReceivedRecord.model_validate(d)
        )
        assert [confluent_reader(v, ctx) for v in values] == [first, second]
        our_reader = AvroDeserializer(ours)
        assert [our_reader.to_model(v, MessageReceivedRecord) for v in values] == [first, second]
    finally:
        ours.close()
        confluent.close()
        admin.delete_topics([topic])[topic].result(timeout=30)
