"""Handlers that are callables other than plain functions register, and refusals name them.

A ``functools.partial`` of an ``async def``, an object with ``async def __call__``, a bound
method and a ``functools.wraps``-decorated handler are all awaited the same way by the runtime;
their event annotation is resolved through the partial, the method or ``__call__``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel

from pipeline.envelope import Message
from pipeline.errors import ConfigError
from pipeline.runtime import App, Context
from pipeline.topics.spec import TopicSpec

LANE = "orders"


class Order(BaseModel):
    """An order."""

    order_id: str


def orders_app() -> App:
    """An App of the plain lane ``orders``."""
    return App([TopicSpec.model_validate({"name": LANE, "partitions": 1})])


async def tagged(tag: str, got: list[Any], event: Order, ctx: Context) -> None:
    """Record the event under ``tag``."""
    got.append((tag, event))


class Recorder:
    """A handler object: ``await recorder(event, ctx)``."""

    def __init__(self) -> None:
        """Nothing recorded yet."""
        self.got: list[Order] = []

    async def __call__(self, event: Order, ctx: Context) -> None:  # noqa: ARG002
        """Record the event."""
        self.got.append(event)

    async def handle(self, event: Order, ctx: Context) -> None:  # noqa: ARG002
        """Record the event (a bound method)."""
        self.got.append(event)


def logged(fn: Callable[[Order, Context], Awaitable[None]]) -> Any:
    """A decorator keeping the handler's signature (``functools.wraps``)."""

    @functools.wraps(fn)
    async def wrapper(event: Any, ctx: Any) -> None:
        await fn(event, ctx)

    return wrapper


def test_a_partial_registers_and_decodes_models() -> None:
    """``partial(tagged, "p", got)`` takes (event, ctx): registered, its events decoded."""
    app = orders_app()
    got: list[Any] = []
    app.handler(LANE)(functools.partial(tagged, "p", got))
    lane = app.lanes[LANE]
    assert lane.event is Order
    message = Message(LANE, 0, 0, b"o1", b'{"order_id":"o1"}', {})
    assert lane.decode(message) == Order(order_id="o1")


def test_an_object_with_async_call_registers_and_decodes_models() -> None:
    """An instance whose ``__call__`` is ``async def``: registered, its events decoded as models."""
    app = orders_app()
    app.handler(LANE)(Recorder())
    assert app.lanes[LANE].event is Order


def test_a_cpu_handler_that_is_no_function_is_one_config_error() -> None:
    """``cpu=True`` needs a module-level function: a partial is refused by one line, named."""

    def crunch(tag: str, event: Order, ctx: Context) -> None:
        """Never runs."""

    app = orders_app()
    with pytest.raises(ConfigError, match=r"CPU-bound handler .*crunch must be a module-level"):
        app.handler(LANE, cpu=True)(functools.partial(crunch, "t"))


def test_a_bound_method_and_a_wrapped_handler_register() -> None:
    """A bound method and a ``functools.wraps`` decorated handler take models."""
    app = orders_app()
    app.handler(LANE)(Recorder().handle)
    assert LANE in app.lanes
    wrapped = orders_app()

    @wrapped.handler(LANE)
    @logged
    async def handle(event: Order, ctx: Context) -> None:
        """Never runs."""

    assert LANE in wrapped.lanes


def test_a_refused_partial_is_named() -> None:
    """A refusal of a partial names it (no AttributeError on ``__qualname__``)."""

    async def takes_int(tag: str, event: int, ctx: Context) -> None:
        """Would get bytes (an int is no body the runtime decodes)."""

    app = orders_app()
    with pytest.raises(ConfigError, match=r"takes_int.*lane 'orders'.*int"):
        app.handler(LANE)(functools.partial(takes_int, "t"))
