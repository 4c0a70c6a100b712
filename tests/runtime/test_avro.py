"""Handlers get typed events from Avro messages in the Confluent wire format, or from JSON."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel
from runtime.helpers import FAST, declare, eventually, lane_spec, running

from pipeline.envelope import Record
from pipeline.registry.client.http import RegistryClient
from pipeline.registry.client.serde import AvroDeserializer, AvroSerializer
from pipeline.registry.server.api import create_app
from pipeline.registry.server.serve import BackgroundServer
from pipeline.registry.stores.sqlite.store import SqliteSchemaStore
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

SCHEMA = {
    "type": "record",
    "name": "Said",
    "namespace": "test.avro",
    "fields": [{"name": "conversation_id", "type": "string"}, {"name": "n", "type": "int"}],
}


class Said(BaseModel):
    """The event both encodings carry."""

    conversation_id: str
    n: int


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RegistryClient]:
    """A client of a real registry server on an SQLite store."""
    store = SqliteSchemaStore(str(tmp_path / "registry.db"))
    with BackgroundServer(create_app(store)) as server:
        client = RegistryClient(server.url)
        yield client
        client.close()
    store.close()


async def test_avro_and_json_values_decode_to_the_model_and_bad_avro_is_dead_lettered(
    transport: Transport, registry: RegistryClient, unique: str
) -> None:
    """An Avro value and a JSON value both reach the handler; a truncated Avro body goes to DLQ."""
    spec = lane_spec(f"avro_{unique}", 1)
    await declare(transport, spec)
    app = App([spec])
    app.avro = AvroDeserializer(registry)
    seen: list[Said] = []

    @app.handler(spec.lane)
    async def handle(event: Said, ctx: Context) -> None:
        seen.append(event)

    avro = AvroSerializer(registry, SCHEMA, f"{spec.name}-value").serialize(
        {"conversation_id": "c", "n": 1}
    )
    json_value = Said(conversation_id="c", n=2).model_dump_json().encode()
    producer = transport.producer()
    cut_short = avro[:6]  # framed with a real schema id, but the body ends early
    await producer.send_many(
        spec.name, [Record(avro, b"c"), Record(json_value, b"c"), Record(cut_short, b"c")]
    )
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST)
    async with running(member):
        await eventually(lambda: member.stats.handled + member.stats.dead_lettered == 3)
    assert [e.n for e in seen] == [1, 2]
    assert member.stats.dead_lettered == 1
