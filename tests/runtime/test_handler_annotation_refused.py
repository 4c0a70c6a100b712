"""A handler whose event is annotated with a type the runtime does not decode into is refused.

A dataclass or a TypedDict (or ``int``, ``Model | None`` ...) was accepted, and the
handler was handed each message's raw bytes: it failed on every one (attribute access on
bytes), so every message went through the retry tiers to the dead-letter topic. Registering
such a handler is now one :class:`ConfigError` naming the lane, the handler, the annotation and
what is decoded; the annotations that were decoded are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

import pytest
from pydantic import BaseModel

from pipeline.envelope import Message
from pipeline.errors import ConfigError
from pipeline.offload.lazy import LazyPayload
from pipeline.runtime import App, Context
from pipeline.testing import TestApp
from pipeline.topics.spec import TopicSpec

LANE = "orders"
TURNS = "notes"


@dataclass
class OrderRecord:
    """An order as a standard-library dataclass."""

    order_id: str


class OrderDict(TypedDict):
    """An order as a TypedDict."""

    order_id: str


class Order(BaseModel):
    """An order as a pydantic model (decoded)."""

    order_id: str


def orders_app() -> App:
    """An App of the plain lane ``orders`` (tiers 1s, 10s) and the debounced lane ``notes``."""
    return App(
        [
            TopicSpec.model_validate(
                {"name": LANE, "partitions": 1, "retry": {"tiers": ["1s", "10s"]}}
            ),
            TopicSpec.model_validate(
                {
                    "name": TURNS,
                    "partitions": 1,
                    "debounce": {"key": "order_id", "quiet_s": 4, "max_wait_s": 30},
                }
            ),
        ]
    )


def annotated(kind: Any) -> Any:
    """An ``async def handle(event, ctx)`` whose event is annotated ``kind``."""

    async def handle(event, ctx):  # type: ignore[no-untyped-def]
        """Never runs."""

    handle.__annotations__ = {"event": kind, "ctx": Context, "return": None}
    return handle


def test_a_dataclass_event_is_refused_when_the_handler_is_registered() -> None:
    """One line naming the lane, the handler, the dataclass and what to annotate it with."""
    app = orders_app()
    with pytest.raises(ConfigError) as caught:

        @app.handler(LANE)
        async def handle(event: OrderRecord, ctx: Context) -> None:
            """Would get bytes and fail on ``event.order_id``."""

    line = str(caught.value)
    assert "\n" not in line
    assert "lane 'orders'" in line
    assert "handle" in line
    assert "OrderRecord" in line
    assert "dataclass" in line
    assert "pydantic model" in line
    assert "bytes" in line
    assert LANE not in app.lanes


def test_a_typeddict_event_is_refused() -> None:
    """A TypedDict is no model either: the line names it and says it is a TypedDict."""
    app = orders_app()
    with pytest.raises(ConfigError, match=r"OrderDict.*TypedDict.*pydantic model") as caught:

        @app.handler(LANE)
        async def handle(event: OrderDict, ctx: Context) -> None:
            """Would get bytes and fail on ``event["order_id"]``."""

    assert "\n" not in str(caught.value)
    assert LANE not in app.lanes


def test_a_turn_of_dataclasses_is_refused() -> None:
    """On a debounced lane, ``list[OrderRecord]`` would be a list of raw values: refused."""
    app = orders_app()
    with pytest.raises(ConfigError, match=r"lane 'notes'.*list\[OrderRecord\]"):

        @app.handler(TURNS)
        async def reply(events: list[OrderRecord], ctx: Context) -> None:
            """Would get a list of bytes."""

    assert TURNS not in app.lanes


@pytest.mark.parametrize(
    "kind",
    [Order | None, Order | bytes, int],
    ids=["Order | None", "Order | bytes", "int"],
)
def test_other_types_not_decoded_into_are_refused(kind: Any) -> None:
    """Anything but a model, the raw value or the message would also get bytes: refused."""
    app = orders_app()
    with pytest.raises(ConfigError, match=r"lane 'orders'.*not decode") as caught:
        app.handler(LANE)(annotated(kind))
    assert "\n" not in str(caught.value)
    assert LANE not in app.lanes


@pytest.mark.parametrize(
    "kind",
    [Order, bytes, Message, Any, object, LazyPayload, bytes | LazyPayload, LazyPayload | bytes],
    ids=["model", "bytes", "Message", "Any", "object", "LazyPayload", "union", "union2"],
)
def test_the_annotations_decoded_are_registered_as_before(kind: Any) -> None:
    """A model, the raw value (bytes, LazyPayload, Any, object) or the message still register."""
    app = orders_app()
    app.handler(LANE)(annotated(kind))
    assert LANE in app.lanes


@pytest.mark.parametrize(
    "item", [Order, bytes, Message, Any], ids=["model", "bytes", "Message", "Any"]
)
def test_the_turns_decoded_are_registered_as_before(item: Any) -> None:
    """``list[Model]``, ``list[bytes]``, ``list[Message]`` (and ``list[Any]``) still register."""
    app = orders_app()
    app.handler(TURNS)(annotated(list[item]))
    assert TURNS in app.lanes


async def test_unannotated_and_model_handlers_still_get_what_they_got() -> None:
    """No annotation: the raw value; a model: the validated model (TestApp, the real runtime)."""
    app = orders_app()
    got: list[Any] = []

    @app.handler(LANE)
    async def handle(event, ctx):  # type: ignore[no-untyped-def]
        got.append(event)

    async with TestApp(app, lanes=[LANE]) as t:
        await t.send(LANE, Order(order_id="o1"), key="o1")
        await t.drain()
        assert got == [b'{"order_id":"o1"}']

    typed = orders_app()

    @typed.handler(LANE)
    async def handle_model(event: Order, ctx: Context) -> None:
        got.append(event)

    async with TestApp(typed, lanes=[LANE]) as t:
        await t.send(LANE, Order(order_id="o2"), key="o2")
        await t.drain()
        assert got[1:] == [Order(order_id="o2")]
        assert t.dead_letters(LANE) == []
