"""A handler whose ``ctx`` annotation is imported only for type checking still registers.

``ruff``'s TC rules move an import used only in annotations (``Context``) under
``if TYPE_CHECKING:``; with ``from __future__ import annotations`` the handler works at runtime,
and registering it must not fail resolving the ``ctx`` (or return) annotation, which the
runtime never reads. The same holds for a CPU-bound handler named by its module path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from pipeline.runtime import App
from pipeline.topics.spec import TopicSpec

if TYPE_CHECKING:
    from pipeline.runtime import Context

LANE = "orders"


class Order(BaseModel):
    """An order."""

    order_id: str


def crunch(event: Order, ctx: Context) -> None:
    """A CPU-bound handler (never runs here)."""


def orders_app() -> App:
    """An App of the plain lane ``orders``."""
    return App([TopicSpec.model_validate({"name": LANE, "partitions": 1})])


def test_a_typing_only_ctx_annotation_registers() -> None:
    """Only the event's annotation is resolved: ``ctx: Context`` need not exist at runtime."""
    app = orders_app()

    @app.handler(LANE)
    async def handle(event: Order, ctx: Context) -> None:
        """Never runs."""

    assert LANE in app.lanes


def test_a_cpu_handler_with_a_typing_only_ctx_registers() -> None:
    """``cpu=True`` with a module-level function: registered, named by its module path."""
    app = orders_app()
    app.handler(LANE, cpu=True)(crunch)
    assert app.lanes[LANE].cpu_ref == f"{__name__}:crunch"
