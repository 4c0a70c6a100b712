"""Event annotations that work at runtime register: none of them is refused, or crashes.

``bytes | None`` (``Optional[bytes]``) is handed the raw value as ``bytes`` is; a model defined
in the function that registers its handler (this module's annotations are strings) resolves
there; ``Annotated[Model, ...]``, a generic model, a ``RootModel`` and a subclass are models. A
name the handler's module cannot resolve is one ConfigError naming it, not a NameError.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Generic, Optional, TypeVar, Union

import pytest
from pydantic import BaseModel, RootModel

from pipeline.errors import ConfigError
from pipeline.runtime import App, Context
from pipeline.testing import TestApp
from pipeline.topics.spec import TopicSpec

if TYPE_CHECKING:
    from pipeline.envelope import Message as OnlyTyped

LANE = "orders"
T = TypeVar("T")


class Order(BaseModel):
    """An order."""

    order_id: str


class Page(BaseModel, Generic[T]):
    """A generic page of items."""

    order_id: str
    items: list[T] = []


class Orders(RootModel[list[Order]]):
    """A root model: a list of orders."""


class RushOrder(Order):
    """A model subclass."""

    rush: bool = True


def orders_app() -> App:
    """An App of the plain lane ``orders``."""
    return App([TopicSpec.model_validate({"name": LANE, "partitions": 1})])


@pytest.mark.parametrize(
    "kind",
    [Optional[bytes], bytes | None, Union[bytes, None], Union[bytes, Any]],  # noqa: UP007, UP045
    ids=["Optional[bytes]", "bytes | None", "Union[bytes, None]", "Union[bytes, Any]"],
)
def test_raw_value_unions_with_none_register(kind: Any) -> None:
    """``Optional[bytes]`` is handed bytes, as ``bytes`` is: a working handler, not refused."""
    app = orders_app()

    async def handle(event, ctx):  # type: ignore[no-untyped-def]
        """Never runs."""

    handle.__annotations__ = {"event": kind, "ctx": Context}
    app.handler(LANE)(handle)
    assert LANE in app.lanes


async def test_an_optional_bytes_handler_gets_the_raw_value() -> None:
    """Registered, the ``bytes | None`` handler gets each message's value (the real runtime)."""
    app = orders_app()
    got: list[Any] = []

    @app.handler(LANE)
    async def handle(event: bytes | None, ctx: Context) -> None:
        got.append(event)

    async with TestApp(app, lanes=[LANE]) as t:
        await t.send(LANE, Order(order_id="o1"), key="o1")
        await t.drain()
        assert got == [b'{"order_id":"o1"}']
        assert t.dead_letters(LANE) == []


@pytest.mark.parametrize(
    "kind",
    [Annotated[Order, "doc"], Page[Order], Orders, RushOrder],
    ids=["Annotated", "generic", "RootModel", "subclass"],
)
def test_models_in_any_form_register(kind: Any) -> None:
    """``Annotated[Model, ...]``, ``Page[Item]``, a RootModel, a subclass: all models."""
    app = orders_app()

    async def handle(event, ctx):  # type: ignore[no-untyped-def]
        """Never runs."""

    handle.__annotations__ = {"event": kind, "ctx": Context}
    app.handler(LANE)(handle)
    assert LANE in app.lanes


def test_a_model_defined_where_the_handler_is_registers() -> None:
    """A model local to the registering function: its string annotation resolves there."""

    class Local(BaseModel):
        order_id: str

    app = orders_app()

    @app.handler(LANE)
    async def handle(event: Local, ctx: Context) -> None:
        """Never runs."""

    assert LANE in app.lanes
    assert app.lanes[LANE].decode  # a model decoder, not the raw value
    assert app.decode_model(b'{"order_id":"o1"}', Local) == Local(order_id="o1")


def test_a_name_only_imported_for_type_checking_is_one_config_error() -> None:
    """An event type the module does not define at runtime: one line naming it and the fix."""
    app = orders_app()
    with pytest.raises(ConfigError) as caught:

        @app.handler(LANE)
        async def handle(event: OnlyTyped, ctx: Context) -> None:
            """Never registered."""

    line = str(caught.value)
    assert "\n" not in line
    assert "lane 'orders'" in line
    assert "OnlyTyped" in line
    assert "TYPE_CHECKING" in line
    assert LANE not in app.lanes
