"""A handler whose event is annotated ``dict`` gets a JSON object, ``str`` gets UTF-8 text.

Both were refused when the handler was registered (the runtime handed every other annotation
the raw bytes). Now ``dict`` (``dict[str, Any]``, ``Mapping[str, Any]``) is the value parsed as
a JSON object and ``str`` the value decoded as UTF-8, on both brokers with a real member, for
one event and for a debounced lane's turn. A value that is not one (not JSON, an array, a
number, nested too deep, not UTF-8) is a validation failure routed as a model's: a dead letter
``fatal`` at once, never retried, its failure line saying what was wrong. Other annotations
(``int``, ``dict[str, int]``, ``str | None`` ...) are still refused with the same line.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import Mapping
from typing import Any

import pytest
from contract.helpers import consume_until
from redis.asyncio import Redis
from runtime.failure_helpers import FAILURES, logged
from runtime.helpers import QUIET, declare, lane_spec, produce, ran_until
from support import delete_group_after

from pipeline import headers as h
from pipeline.envelope import Message, Record
from pipeline.errors import ConfigError
from pipeline.runtime import App, Context
from pipeline.transport.protocol import Transport

DEEP_ARRAY = b"[" * 100_000
"""Nested far past any parser's depth (``json`` raises RecursionError on it)."""
DEEP_OBJECT = b'{"a":' * 5_000 + b"1" + b"}" * 5_000


def annotated(kind: Any) -> Any:
    """An ``async def handle(event, ctx)`` whose event is annotated ``kind``."""

    async def handle(event, ctx):  # type: ignore[no-untyped-def]
        """Never runs."""

    handle.__annotations__ = {"event": kind, "ctx": Context, "return": None}
    return handle


@pytest.mark.parametrize(
    "kind",
    [dict, dict[str, Any], Mapping[str, Any], typing.Mapping[str, Any], typing.Dict, str],  # noqa: UP006
    ids=["dict", "dict[str, Any]", "Mapping", "typing.Mapping", "typing.Dict", "str"],
)
def test_a_json_object_or_text_event_registers(kind: Any) -> None:
    """``dict`` in its usual spellings and ``str`` are decoded: the handler registers."""
    app = App([lane_spec("jsonreg", 1)])
    app.handler("jsonreg")(annotated(kind))
    assert "jsonreg" in app.lanes


@pytest.mark.parametrize("item", [dict, dict[str, Any], str], ids=["dict", "dict[str, Any]", "str"])
def test_a_turn_of_json_objects_or_texts_registers(item: Any) -> None:
    """On a debounced lane, ``list[dict]`` and ``list[str]`` are turns decoded item by item."""
    app = App([lane_spec("jsonturn", 1, debounce=QUIET)])
    app.handler("jsonturn")(annotated(list[item]))
    assert "jsonturn" in app.lanes


@pytest.mark.parametrize(
    "kind",
    [int, dict[str, int], dict[int, Any], dict[str, Any] | None, str | None, bytes | str],
    ids=["int", "dict[str, int]", "dict[int, Any]", "dict | None", "str | None", "bytes | str"],
)
def test_what_is_still_not_decoded_is_refused_with_the_same_line(kind: Any) -> None:
    """The line names the lane and what is decoded, now ``dict[str, Any]`` and ``str`` too."""
    app = App([lane_spec("jsonrefused", 1)])
    with pytest.raises(ConfigError, match=r"lane 'jsonrefused'.*not decode") as caught:
        app.handler("jsonrefused")(annotated(kind))
    line = str(caught.value)
    assert "\n" not in line
    assert "dict[str, Any] (a JSON object), str (UTF-8 text)" in line
    assert "jsonrefused" not in app.lanes


async def _dead_letters(transport: Transport, topic: str, count: int) -> list[Message]:
    """The first ``count`` messages of the dead-letter topic ``topic``, by a group of its own."""
    consumer = transport.consumer(f"dlq-{topic}", [topic])
    try:
        return await consume_until(consumer, lambda got: len(got) >= count)
    finally:
        await consumer.close()


HOSTILE_OBJECTS = {
    b"not json": "Invalid JSON",
    b"[1, 2]": "Input should be an object",
    b"42": "Input should be an object",
    b'"text"': "Input should be an object",
    b"": "Invalid JSON",
    DEEP_ARRAY: "recursion limit exceeded",
    DEEP_OBJECT: "recursion limit exceeded",
    b'{"a": 1} trailing': "Invalid JSON",
    b"\xff\xfe{}": "Invalid JSON",
}
"""Values that are no JSON object, and what the dead letter's error says of each."""


async def test_a_dict_handler_gets_json_objects_and_hostile_values_are_dead_letters(
    transport: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two objects reach the handler as dicts; each hostile value is one ``fatal`` dead letter.

    None of them is retried (the lane has a tier), each failure line says what was wrong.
    """
    caplog.set_level(logging.WARNING, logger=FAILURES)
    spec = lane_spec(f"jsonobj_{unique}", 1, retry={"tiers": ["200ms"], "max_attempts": 3})
    await declare(transport, spec)
    app = App([spec])
    got: list[dict[str, Any]] = []

    @app.handler(spec.lane)
    async def handle(event: dict[str, Any], ctx: Context) -> None:
        assert isinstance(event, dict)
        got.append(event)

    good = [b'{"order_id": "o1", "items": [1, 2]}', '{"name": "é", "n": null}'.encode()]
    hostile = list(HOSTILE_OBJECTS)
    await produce(transport, spec.name, [Record(v, b"k") for v in [*good, *hostile]])
    member = await ran_until(
        app, transport, redis, unique, lambda m: m.stats.handled + m.stats.dead_lettered >= 11
    )
    delete_group_after(transport, member.group, spec.topic_names())
    assert got == [{"order_id": "o1", "items": [1, 2]}, {"name": "é", "n": None}]
    assert (member.stats.handled, member.stats.dead_lettered, member.stats.retried) == (2, 9, 0)
    dead = await _dead_letters(transport, spec.dead_letter, len(hostile))
    assert [m.value for m in dead] == hostile
    for message in dead:
        assert message.headers[h.DEAD_REASON] == b"fatal"
        assert message.headers[h.ERROR_CLASS] == b"pydantic_core._pydantic_core.ValidationError"
        error = message.headers[h.ERROR_MESSAGE].decode()
        assert "the event's value as a JSON object" in error
        assert HOSTILE_OBJECTS[message.value] in error, error
    heads = [r.getMessage().splitlines()[0] for r in logged(caplog, FAILURES, logging.WARNING)]
    assert heads, "no failure line"
    assert all(
        "ValidationError: 1 validation error for the event's value as a JSON object" in head
        and head.endswith(
            f"next: dead letter (fatal) (inspect: pipeline redrive {spec.dead_letter} --dry-run)"
        )
        for head in heads
    ), heads


async def test_a_str_handler_gets_text_and_a_value_not_utf8_is_a_dead_letter(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """UTF-8 values reach the handler as str, as is; invalid UTF-8 is a ``fatal`` dead letter."""
    spec = lane_spec(f"jsontext_{unique}", 1, retry={"tiers": ["200ms"], "max_attempts": 3})
    await declare(transport, spec)
    app = App([spec])
    got: list[str] = []

    @app.handler(spec.lane)
    async def handle(event: str, ctx: Context) -> None:
        assert isinstance(event, str)
        got.append(event)

    good = ["héllo, wörld", '{"not": "parsed"}', ""]
    hostile = [b"\xff\xfe", b"caf\xe9", b"\xed\xa0\x80"]  # not UTF-8; latin-1; a lone surrogate
    records = [Record(v.encode(), b"k") for v in good] + [Record(v, b"k") for v in hostile]
    await produce(transport, spec.name, records)
    member = await ran_until(
        app, transport, redis, unique, lambda m: m.stats.handled + m.stats.dead_lettered >= 6
    )
    delete_group_after(transport, member.group, spec.topic_names())
    assert got == good
    assert (member.stats.handled, member.stats.dead_lettered, member.stats.retried) == (3, 3, 0)
    dead = await _dead_letters(transport, spec.dead_letter, len(hostile))
    assert [m.value for m in dead] == hostile
    for message in dead:
        assert message.headers[h.DEAD_REASON] == b"fatal"
        error = message.headers[h.ERROR_MESSAGE].decode()
        assert "the event's value as UTF-8 text" in error
        assert "unable to parse raw data as a unicode string" in error


async def test_a_turn_of_json_objects_and_a_malformed_one_dead_lettered_at_once(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """A debounced ``list[dict]`` lane: one turn of the conversation's objects, in order.

    The conversation is the JSON member ``debounce.key`` names; a value that is no JSON object
    is a dead letter (``fatal``) before it is buffered, and the turn runs without it.
    """
    spec = lane_spec(f"jsonturns_{unique}", 1, debounce=QUIET)
    await declare(transport, spec)
    app = App([spec])
    turns: list[list[dict[str, Any]]] = []

    @app.handler(spec.lane)
    async def handle(events: list[dict[str, Any]], ctx: Context) -> None:
        turns.append(events)

    values = [
        b'{"conversation_id": "c1", "n": 0}',
        b'[{"conversation_id": "c1", "n": 1}]',
        b'{"conversation_id": "c1", "n": 2}',
    ]
    await produce(transport, spec.name, [Record(v, b"c1") for v in values])
    member = await ran_until(
        app, transport, redis, unique, lambda m: m.stats.turns == 1 and m.stats.dead_lettered == 1
    )
    delete_group_after(transport, member.group, spec.topic_names())
    assert turns == [[{"conversation_id": "c1", "n": 0}, {"conversation_id": "c1", "n": 2}]]
    (dead,) = await _dead_letters(transport, spec.dead_letter, 1)
    assert dead.value == values[1]
    assert dead.headers[h.DEAD_REASON] == b"fatal"


async def test_a_turn_of_texts(transport: Transport, redis: Redis, unique: str) -> None:
    """A debounced ``list[str]`` lane (conversations by message key): the texts, in order."""
    spec = lane_spec(f"textturns_{unique}", 1, debounce=QUIET)
    await declare(transport, spec)
    app = App([spec])
    turns: list[list[str]] = []

    @app.handler(spec.lane)
    async def handle(events: list[str], ctx: Context) -> None:
        turns.append(events)

    await produce(transport, spec.name, [Record(v.encode(), b"c1") for v in ["a", "bé", "c"]])
    member = await ran_until(app, transport, redis, unique, lambda m: m.stats.turns == 1)
    delete_group_after(transport, member.group, spec.topic_names())
    assert turns == [["a", "bé", "c"]]
