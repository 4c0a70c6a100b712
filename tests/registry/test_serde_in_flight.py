"""Schema evolution a consumer meets in flight: a new enum symbol, a schema id the registry lacks.

Both go through the runtime's decode path on a real registry server, and the broker cases
through a member on each real transport, so what is asserted is what a user sees: the event
the handler gets, or the dead letter's ``pl-error-message``.
"""

from __future__ import annotations

import enum
import json
import logging
import uuid
from typing import Any, Literal

import pytest
from contract.helpers import consume_until
from pydantic import BaseModel, ConfigDict
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.errors import DeadLetter
from pipeline.registry.client.http import RegistryClient
from pipeline.registry.client.serde import AvroDeserializer, AvroSerializer
from pipeline.registry.client.wire import header
from pipeline.registry.errors import RegistryUnreachable, SchemaNotFound
from pipeline.retry.policy import default_retryable
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


class Color(enum.StrEnum):
    """The v1 enum, without a default for symbols it lacks."""

    RED = "RED"
    BLUE = "BLUE"


class TolerantColor(enum.StrEnum):
    """The v1 enum with a default: a symbol it lacks reads as RED, as Avro's enum default."""

    RED = "RED"
    BLUE = "BLUE"

    @classmethod
    def _missing_(cls, value: object) -> TolerantColor:  # noqa: ARG003 - Enum's signature
        return cls.RED


class Paint(BaseModel):
    """A v1 consumer's model whose enum has no default."""

    model_config = ConfigDict(extra="forbid")
    c: Color


class LiteralPaint(BaseModel):
    """The same, its enum a Literal (which cannot have a default)."""

    c: Literal["RED", "BLUE"]


class TolerantPaint(BaseModel):
    """A v1 consumer's model whose enum has a default."""

    c: TolerantColor


def _paint(symbols: list[str], default: str | None) -> str:
    color: dict[str, object] = {"type": "enum", "name": "Color", "symbols": symbols}
    if default is not None:
        color["default"] = default
    return json.dumps(
        {
            "type": "record",
            "name": "Paint",
            "namespace": "t",
            "fields": [{"name": "c", "type": color}],
        }
    )


def _green_in_v2(client: RegistryClient, subject: str, default: str | None) -> bytes:
    """A message holding GREEN in ``subject``'s v2, whose enum gained it (v1 registered first)."""
    client.register(subject, _paint(["RED", "BLUE"], default))
    return AvroSerializer(client, _paint(["RED", "BLUE", "GREEN"], default), subject)(
        {"c": "GREEN"}
    )


@pytest.mark.parametrize("default", [None, "RED"])
def test_a_symbol_the_models_enum_lacks_is_dead_lettered_naming_it_and_the_version(
    ours: RegistryClient, default: str | None
) -> None:
    """A v1 model's enum without a default dead-letters GREEN, naming it and subject version 2."""
    subject = f"paint-{uuid.uuid4().hex}-value"
    data = _green_in_v2(ours, subject, default)
    app = App(topics=[])
    app.avro = AvroDeserializer(ours)
    for model in (Paint, LiteralPaint):
        with pytest.raises(DeadLetter) as info:
            app.decode_model(data, model)
        reason = str(info.value)
        assert "'GREEN'" in reason
        assert f"{subject} version 2" in reason
        assert "no default" in reason
        assert len(reason) < 500  # the dead letter's pl-error-message keeps 500 characters
    assert app.decode_model(data, TolerantPaint) == TolerantPaint(c=TolerantColor.RED)


def test_a_reader_schemas_enum_default_resolves_a_new_symbol(ours: RegistryClient) -> None:
    """With a v1 reader schema, GREEN reads as its default RED; without one it names the version."""
    subject = f"paint-{uuid.uuid4().hex}-value"
    data = _green_in_v2(ours, subject, "RED")
    tolerant = AvroDeserializer(ours, reader_schema=_paint(["RED", "BLUE"], "RED"))
    assert tolerant.to_model(data, Paint) == Paint(c=Color.RED)
    app = App(topics=[])
    app.avro = AvroDeserializer(ours, reader_schema=_paint(["RED", "BLUE"], None))
    with pytest.raises(DeadLetter, match=rf"{subject} version 2.*GREEN"):
        app.decode_model(data, Paint)


async def test_a_new_enum_symbol_through_a_member(
    transport: Transport, ours: RegistryClient, unique: str
) -> None:
    """A member hands GREEN to a model with a default as RED and dead-letters it for one without."""
    strict, tolerant = lane_spec(f"paint_{unique}", 1), lane_spec(f"tpaint_{unique}", 1)
    await declare(transport, strict, tolerant)
    app = App([strict, tolerant])
    app.avro = AvroDeserializer(ours)
    seen: list[TolerantPaint] = []

    @app.handler(strict.lane)
    async def handle_strict(event: Paint, ctx: Context) -> None:
        raise AssertionError("GREEN reached a model whose enum lacks it")

    @app.handler(tolerant.lane)
    async def handle_tolerant(event: TolerantPaint, ctx: Context) -> None:
        seen.append(event)

    subject = f"paint-{unique}-value"
    data = _green_in_v2(ours, subject, None)
    await produce(transport, strict.name, [Record(data, b"k")])
    await produce(transport, tolerant.name, [Record(data, b"k")])
    member = Member(app, transport, f"g-{unique}", FAST)
    async with running(member):
        await eventually(lambda: member.stats.dead_lettered == 1 and member.stats.handled == 1)
    assert seen == [TolerantPaint(c=TolerantColor.RED)]
    dlq = transport.consumer(f"dlq-{unique}", [strict.dead_letter])
    (dead,) = await consume_until(dlq, lambda got: len(got) >= 1)
    await dlq.close()
    assert dead.headers[h.ERROR_CLASS] == b"pipeline.errors.DeadLetter"
    assert b"'GREEN'" in dead.headers[h.ERROR_MESSAGE]
    assert f"{subject} version 2".encode() in dead.headers[h.ERROR_MESSAGE]


def test_an_unknown_schema_id_says_where_it_asked_and_what_to_do(
    ours: RegistryClient, sqlite_registry_url: str
) -> None:
    """A schema id the registry lacks fails retryably, naming the id, the registry and the fix."""
    app = App(topics=[])
    app.avro = AvroDeserializer(ours)
    with pytest.raises(SchemaNotFound) as info:
        app.decode_model(header(4711) + b"\x02", Paint)
    reason = str(info.value)
    assert default_retryable(info.value)
    assert "schema id 4711" in reason
    assert sqlite_registry_url in reason
    assert "another registry" in reason
    assert "hard-deleted" in reason
    assert "redrive" in reason


async def test_an_unknown_schema_id_goes_through_the_tiers_to_a_dead_letter_that_says_why(
    transport: Transport,
    ours: RegistryClient,
    sqlite_registry_url: str,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Once its tiers are spent, a message of an unknown schema id is dead-lettered saying why."""
    spec = lane_spec(f"unknown_id_{unique}", 1, retry={"tiers": ["100ms"], "max_attempts": 2})
    await declare(transport, spec)
    app = App([spec])
    app.avro = AvroDeserializer(ours)

    @app.handler(spec.lane)
    async def handle(event: Paint, ctx: Context) -> None:
        raise AssertionError("a message of an unknown schema id reached its handler")

    await produce(transport, spec.name, [Record(header(4711) + b"\x02", b"k")])
    member = Member(app, transport, f"g-{unique}", FAST)
    with caplog.at_level(logging.DEBUG, logger="pipeline"):
        async with running(member):
            await eventually(lambda: member.stats.dead_lettered == 1)
    assert member.stats.retried == 1
    dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
    (dead,) = await consume_until(dlq, lambda got: len(got) >= 1)
    await dlq.close()
    assert dead.headers[h.ERROR_CLASS] == b"pipeline.registry.errors.SchemaNotFound"
    message = dead.headers[h.ERROR_MESSAGE].decode()
    assert "schema id 4711" in message
    assert sqlite_registry_url in message
    assert "redrive" in message


class _VersionsDown:
    """The real client, its subject-versions lookup failing (counted), as a registry timing out."""

    def __init__(self, client: RegistryClient) -> None:
        self._client = client
        self.asked = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def subject_versions(self, schema_id: int) -> list[tuple[str, int]]:
        self.asked += 1
        raise RegistryUnreachable(f"schema {schema_id}'s versions: timed out")


def test_a_failed_lookup_of_the_version_is_not_made_again_for_every_message(
    ours: RegistryClient,
) -> None:
    """Only the reason's wording needs the versions: a registry that fails is asked once.

    Each lookup blocks its caller (the member's event loop) for up to the client's timeout, so
    asking again for every message that does not fit froze the member message after message.
    """
    subject = f"paint-{uuid.uuid4().hex}-value"
    data = _green_in_v2(ours, subject, None)
    down = _VersionsDown(ours)
    app = App(topics=[])
    app.avro = AvroDeserializer(down)  # type: ignore[arg-type] # the real client underneath
    for _ in range(3):
        with pytest.raises(DeadLetter) as info:
            app.decode_model(data, Paint)
        assert "'GREEN'" in str(info.value)
    assert down.asked == 1
