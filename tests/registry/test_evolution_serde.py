"""Schema evolution through the serdes and a real registry: defaults a newer schema adds."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from registry.samples import message

from pipeline.registry.client.events import MessageReceivedRecord
from pipeline.registry.client.http import RegistryClient
from pipeline.registry.client.serde import AvroDeserializer, AvroSerializer
from pipeline.runtime.app import App

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def _record(*fields: dict[str, Any]) -> str:
    base = [{"name": "n", "type": "int"}]
    return json.dumps(
        {"type": "record", "name": "Doc", "namespace": "t", "fields": base + list(fields)}
    )


ADDED = (
    {"name": "raw", "type": "bytes", "default": "\u00ff\u0001"},
    {"name": "tag", "type": {"type": "fixed", "name": "Tag", "size": 2}, "default": "\u00fe\u0002"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}, "default": 1000},
    {
        "name": "price",
        "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2},
        "default": "\u0004\u00d2",
    },
    {
        "name": "inner",
        "type": {"type": "record", "name": "Inner", "fields": [{"name": "b", "type": "bytes"}]},
        "default": {"b": "\u00ff"},
    },
    {"name": "blobs", "type": {"type": "array", "items": "bytes"}, "default": ["\u00ff"]},
)
EXPECTED = {
    "raw": b"\xff\x01",
    "tag": b"\xfe\x02",
    "at": datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
    "price": Decimal("12.34"),
    "inner": {"b": b"\xff"},
    "blobs": [b"\xff"],
}


def test_reader_fills_binary_and_logical_defaults_as_the_values_they_stand_for(
    ours: RegistryClient,
) -> None:
    """A v2 reader fills a v1 message's bytes, fixed and logical defaults as bytes, datetimes."""
    subject = f"doc-{uuid.uuid4().hex}-value"
    old = AvroSerializer(ours, _record(), subject)({"n": 1})
    new_schema = _record(*ADDED)
    got = AvroDeserializer(ours, reader_schema=new_schema)(old)
    assert got == {"n": 1, **EXPECTED}
    written = AvroSerializer(ours, new_schema, subject)({"n": 2, **EXPECTED})
    assert AvroDeserializer(ours, reader_schema=new_schema)(written) == {"n": 2, **EXPECTED}


def test_serializer_writes_a_missing_field_with_its_binary_default(ours: RegistryClient) -> None:
    """A value leaving out fields with bytes, fixed or logical defaults is written with them."""
    subject = f"doc-{uuid.uuid4().hex}-value"
    data = AvroSerializer(ours, _record(*ADDED), subject)({"n": 3})
    assert AvroDeserializer(ours)(data) == {"n": 3, **EXPECTED}


def test_consumer_on_the_old_model_ignores_a_field_the_new_schema_adds(
    ours: RegistryClient,
) -> None:
    """A handler whose model forbids extras reads a v2 message as v1, skipping the new field."""
    tree = json.loads((SCHEMAS / "message_received.avsc").read_text())
    added = {"name": "lang", "type": "string", "default": "und"}
    v2 = json.dumps({**tree, "fields": [*tree["fields"], added]})
    subject = f"messages-{uuid.uuid4().hex}-value"
    data = AvroSerializer(ours, v2, subject)({**message().model_dump(), "lang": "fr"})
    app = App(topics=[])
    app.avro = AvroDeserializer(ours)
    assert app.decode_model(data, MessageReceivedRecord) == message()
