"""Hostile Avro bodies at the consumer: small messages that claim huge or deep values."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from pipeline.errors import DeadLetter
from pipeline.registry.client.http import RegistryClient
from pipeline.registry.client.serde import AvroDeserializer, AvroSerializer
from pipeline.registry.client.wire import header
from pipeline.registry.errors import SerdeError
from pipeline.runtime.app import App

EMPTY = {"type": "record", "name": "Empty", "fields": []}
NULLS = {
    "type": "record",
    "name": "Nulls",
    "fields": [
        {"name": "a", "type": {"type": "array", "items": "null"}},
        {"name": "e", "type": {"type": "array", "items": EMPTY}},
        {"name": "n", "type": {"type": "array", "items": {"type": "array", "items": "null"}}},
        {"name": "i", "type": {"type": "array", "items": "int"}},
    ],
}
NODE = {
    "type": "record",
    "name": "Node",
    "fields": [{"name": "next", "type": ["null", "Node"]}],
}


class Nulls(BaseModel):
    """The model of NULLS."""

    a: list[None]
    e: list[dict[str, None]]
    n: list[list[None]]
    i: list[int]


def zigzag(n: int) -> bytes:
    """``n`` as an Avro long (zigzag varint)."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


@contextlib.contextmanager
def _naming(case: str) -> Iterator[None]:
    """Name the failing case in the test's failure."""
    try:
        yield
    except pytest.fail.Exception as exc:
        raise AssertionError(f"{case}: {exc}") from None


def test_arrays_of_items_that_take_no_bytes_cannot_claim_millions(ours: RegistryClient) -> None:
    """A few bytes claiming millions of null or empty-record items are a SerdeError, not a stall."""
    schema_id = ours.register("nulls-value", json.dumps(NULLS))
    frame = header(schema_id)
    end = zigzag(0)
    many = 1 << 22
    hostile = {
        "nulls": zigzag(many) + end + end * 3,
        "nulls in a negative block": zigzag(-many) + zigzag(0) + end + end * 3,
        "empty records": end + zigzag(many) + end + end * 2,
        "nested": end + end + zigzag(64) + (zigzag(many // 64) + end) * 64 + end + end,
        "2^62 nulls": zigzag(1 << 62) + end + end * 3,
    }
    deserialize = AvroDeserializer(ours)
    app = App(topics=[])
    app.avro = deserialize
    for name, body in hostile.items():
        with _naming(name), pytest.raises(SerdeError, match="items that take no bytes"):
            deserialize(frame + body)
        with pytest.raises(DeadLetter, match="items that take no bytes"):
            app.decode_model(frame + body, Nulls)
    fine = {"a": [None] * 1000, "e": [{}] * 1000, "n": [[None] * 10] * 10, "i": list(range(10**5))}
    data = AvroSerializer(ours, json.dumps(NULLS), "nulls-value")(fine)
    assert deserialize(data) == fine


def test_values_nested_past_the_bound_are_refused_not_a_crash(ours: RegistryClient) -> None:
    """A 10 kB body nesting a recursive record 10 000 deep is a SerdeError, not a segfault."""
    schema_id = ours.register("node-value", json.dumps(NODE))
    deserialize = AvroDeserializer(ours)
    with pytest.raises(SerdeError, match="nests deeper than"):
        deserialize(header(schema_id) + zigzag(1) * 10_000 + zigzag(0))
    chain: dict[str, object] = {"next": None}
    for _ in range(100):
        chain = {"next": chain}
    data = AvroSerializer(ours, json.dumps(NODE), "node-value")(chain)
    assert deserialize(data) == chain


def test_json_nested_too_deep_for_the_parser_is_a_serde_error() -> None:
    """With allow_json, JSON nested past the parser's depth is a SerdeError, not RecursionError."""
    client = RegistryClient("http://127.0.0.1:9")  # never called: JSON needs no registry
    with pytest.raises(SerdeError, match="invalid JSON message"):
        AvroDeserializer(client, allow_json=True)(b'{"a":' + b"[" * 100_000)
    client.close()
