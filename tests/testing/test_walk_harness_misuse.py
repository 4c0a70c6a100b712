"""A TestApp used the wrong way round says so in one line: what, and how to use it instead.

Each case is a mistake a developer makes in a first test: sending before ``async with``,
after it, entering one TestApp twice, a misspelt lane given to ``send`` or ``lanes=``, asking
about a lane the TestApp does not run, and throttle limits for an App with no throttled lane.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from pipeline.errors import ConfigError
from pipeline.runtime import App, Context
from pipeline.testing import TestApp
from pipeline.topics.spec import TopicSpec


class Order(BaseModel):
    """An order event."""

    order_id: str


def two_lanes() -> App:
    """An App of an ordered lane with tiers (``orders``) and a debounced one (``notes``)."""
    app = App(
        [
            TopicSpec.model_validate(
                {"name": "orders", "partitions": 2, "retry": {"tiers": ["5s", "1m"]}}
            ),
            TopicSpec.model_validate(
                {
                    "name": "notes",
                    "partitions": 2,
                    "debounce": {"key": "order_id", "quiet_s": 3, "max_wait_s": 20},
                }
            ),
        ]
    )

    @app.handler("orders")
    async def handle(event: Order, ctx: Context) -> None:
        """Accept every order."""

    @app.handler("notes")
    async def turn(events: list[Order], ctx: Context) -> None:
        """Accept every turn."""

    return app


NOT_RUNNING = r"^the TestApp is not running: use `async with TestApp\(app\) as t`"
STOPPED = r"^the TestApp has stopped \(its `async with` block ended\)"


async def test_sending_before_async_with_says_to_start_it() -> None:
    """Not ``topic 'orders' does not exist (declare it in topics/ ...)``: it is declared."""
    t = TestApp(two_lanes())
    with pytest.raises(ConfigError, match=NOT_RUNNING):
        await t.send("orders", Order(order_id="o1"), key="o1")
    with pytest.raises(ConfigError, match=NOT_RUNNING):
        await t.drain()
    with pytest.raises(ConfigError, match=NOT_RUNNING):
        await t.advance(1)


async def test_driving_after_the_block_ended_says_it_stopped() -> None:
    """Not ``the member stopped on its own``: the test's own ``async with`` stopped it."""
    async with TestApp(two_lanes()) as t:
        await t.send("orders", Order(order_id="o1"), key="o1")
        await t.drain()
    with pytest.raises(ConfigError, match=STOPPED):
        await t.send("orders", Order(order_id="o2"), key="o2")
    with pytest.raises(ConfigError, match=STOPPED):
        await t.drain()
    with pytest.raises(ConfigError, match=STOPPED):
        await t.advance(1)
    assert [r.outcome for r in t.runs("orders")] == ["handled"]  # what ran stays readable


async def test_entering_a_test_app_twice_says_to_make_a_new_one() -> None:
    """Not ``create topic 'orders': topic already exists``."""
    t = TestApp(two_lanes())
    async with t:
        pass
    with pytest.raises(ConfigError, match=r"^a TestApp runs once: make a new TestApp\(app\)"):
        async with t:
            pass


async def test_a_misspelt_lane_given_to_send_names_the_lanes() -> None:
    """Not ``topic 'order' does not exist``; a topic of the App (a tier, a dead letter) is fine."""
    async with TestApp(two_lanes()) as t:
        with pytest.raises(
            ConfigError,
            match=r"^no lane or topic 'order' in this TestApp \(lanes: notes, orders\)$",
        ):
            await t.send("order", Order(order_id="o1"), key="o1")
        await t.send("orders.dlq", Order(order_id="o1"), key="o1")
        assert len(t.messages("orders.dlq")) == 1


def test_a_misspelt_lane_given_to_lanes_names_the_apps_lanes() -> None:
    """``lanes=["order"]`` names the lanes the App has."""
    with pytest.raises(
        ConfigError,
        match=r"^no handler registered for lane\(s\) order \(the App's lanes: notes, orders\)$",
    ):
        TestApp(two_lanes(), lanes=["order"])


async def test_asking_about_a_lane_the_test_app_does_not_run_is_an_error() -> None:
    """With ``lanes=["notes"]``, ``runs("orders")`` is never anything but empty: it says so."""
    async with TestApp(two_lanes(), lanes=["notes"]) as t:
        await t.send("orders", Order(order_id="o1"), key="o1")
        await t.drain()
        message = r"^lane 'orders' is not run by this TestApp \(lanes=\['notes'\]\)"
        for ask in (t.runs, t.handled, t.retried, t.dead_letters, t.peak_concurrency):
            with pytest.raises(ConfigError, match=message):
                ask("orders")


def test_throttle_limits_for_an_app_without_a_throttled_lane_are_an_error() -> None:
    """Limits no lane uses would be dropped, and the test of the throttle pass without one."""
    with pytest.raises(
        ConfigError,
        match=r"^throttle_limits given, but no lane of this TestApp declares `throttle:` "
        r"\(lanes: notes, orders\)",
    ):
        TestApp(two_lanes(), throttle_limits={"org:acme": 2})
