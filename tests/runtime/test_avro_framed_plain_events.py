"""An Avro-framed value sent to a lane whose event is ``dict`` or ``str``: the dead letter says so.

A value in the Confluent wire format (byte 0, a 4-byte schema id, the Avro body) on a lane whose
handler takes ``dict[str, Any]`` was dead-lettered (``fatal``) as ``Invalid JSON: expected value
at line 1 column 1`` and nothing more; on a ``str`` lane, when the body is no UTF-8, as a value
no unicode string. The error now names the framing, the schema id and what to do: annotate the
event with a pydantic model of the record (decoded through the schema registry) or produce
JSON (text). It is still a ``ValidationError``, a ``fatal`` dead letter never retried.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from contract.helpers import consume_until
from redis.asyncio import Redis
from runtime.helpers import declare, lane_spec, produce, ran_until
from support import delete_group_after

from pipeline import headers as h
from pipeline.envelope import Message, Record
from pipeline.registry.client.wire import header
from pipeline.runtime import App, Context
from pipeline.transport.protocol import Transport

OBJECT_ID = 7
TEXT_ID = 200
"""Its last header byte (0xc8) followed by the body's first is no UTF-8."""
BODY = b"\x06abc\x02"
"""An Avro record body: the string "abc", then the int 1."""
_MAPPING = "collections.abc.Mapping[str, Any]"
"""How failure lines write that annotation."""


async def _dead_letters(transport: Transport, topic: str, count: int) -> list[Message]:
    consumer = transport.consumer(f"dlq-{topic}", [topic])
    try:
        return await consume_until(consumer, lambda got: len(got) >= count)
    finally:
        await consumer.close()


@pytest.mark.parametrize(
    ("kind", "schema_id", "title", "shown"),
    [
        (dict[str, Any], OBJECT_ID, "the event's value as a JSON object", "dict[str, Any]"),
        (Mapping[str, Any], OBJECT_ID, "the event's value as a JSON object", _MAPPING),
        (str, TEXT_ID, "the event's value as UTF-8 text", "str"),
    ],
    ids=["dict", "Mapping", "str"],
)
async def test_an_avro_framed_value_is_a_dead_letter_naming_its_framing(
    transport: Transport,
    redis: Redis,
    unique: str,
    kind: Any,
    schema_id: int,
    title: str,
    shown: str,
) -> None:
    """One ``fatal`` dead letter, not retried, whose error names the wire format and the id."""
    spec = lane_spec(f"avroplain_{unique}", 1, retry={"tiers": ["200ms"], "max_attempts": 3})
    await declare(transport, spec)
    app = App([spec])

    async def handle(event, ctx):  # type: ignore[no-untyped-def]
        """Never runs."""

    handle.__annotations__ = {"event": kind, "ctx": Context, "return": None}
    app.handler(spec.lane)(handle)
    framed = header(schema_id) + BODY
    await produce(transport, spec.name, [Record(framed, b"k")])
    member = await ran_until(app, transport, redis, unique, lambda m: m.stats.dead_lettered >= 1)
    delete_group_after(transport, member.group, spec.topic_names())
    assert (member.stats.handled, member.stats.dead_lettered, member.stats.retried) == (0, 1, 0)
    (dead,) = await _dead_letters(transport, spec.dead_letter, 1)
    assert dead.value == framed
    assert dead.headers[h.DEAD_REASON] == b"fatal"
    assert dead.headers[h.ERROR_CLASS] == b"pydantic_core._pydantic_core.ValidationError"
    error = dead.headers[h.ERROR_MESSAGE].decode()
    assert title in error, error
    assert f"Avro in the Confluent wire format (schema id {schema_id})" in error, error
    assert f"an event annotated {shown}" in error, error
    assert "pydantic model of the record" in error, error
    assert "PIPELINE_REGISTRY__URL" in error, error
    assert "docs/registry.md" in error, error
