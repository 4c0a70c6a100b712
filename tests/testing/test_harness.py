"""TestApp: the real runtime on in-memory services; what ran, retried, was skipped or produced."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from pipeline.errors import ConfigError, Retry, Skip
from pipeline.runtime import App, Context
from pipeline.runtime.pressure import LinuxProbe, Pressure
from pipeline.testing import TestApp
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import TopicConfig


class Order(BaseModel):
    """An order event."""

    order_id: str
    fail_times: int = 0


def orders_app(handler_calls: list[str]) -> App:
    """An App of one lane (tiers 1s and 10s) whose handler fails an order ``fail_times`` times."""
    spec = TopicSpec.model_validate(
        {"name": "orders", "partitions": 4, "retry": {"tiers": ["1s", "10s"]}}
    )
    app = App([spec])

    @app.handler("orders")
    async def handle(event: Order, ctx: Context) -> None:
        handler_calls.append(event.order_id)
        if event.order_id == "skip":
            raise Skip
        if ctx.attempt <= event.fail_times:
            raise Retry(f"attempt {ctx.attempt} failed")

    return app


async def test_a_retry_through_two_tiers_then_success() -> None:
    """Failing twice, the event waits in .retry.1s then .retry.10s and succeeds on attempt 3."""
    async with TestApp(orders_app([])) as t:
        await t.send("orders", Order(order_id="o1", fail_times=2), key="o1", tenant="acme")
        await t.drain()
        assert [(r.attempt, r.outcome) for r in t.runs("orders")] == [
            (1, "failed"),
            (2, "failed"),
            (3, "handled"),
        ]
        assert [m.topic for m in t.retried("orders")] == ["orders.retry.1s", "orders.retry.10s"]
        assert [m.headers["pl-attempt"] for m in t.retried("orders")] == [b"2", b"3"]
        assert t.dead_letters("orders") == []
        assert t.handled("orders") == [Order(order_id="o1", fail_times=2)]
        assert (t.stats.retried, t.stats.handled) == (2, 1)


async def test_a_skip_is_recorded_and_nothing_is_routed() -> None:
    """A handler raising Skip ends the event: outcome skipped, no retry, no dead letter."""
    async with TestApp(orders_app([])) as t:
        await t.send("orders", Order(order_id="skip"), key="s")
        await t.drain()
        assert [r.outcome for r in t.runs("orders")] == ["skipped"]
        assert t.retried("orders") == []
        assert t.dead_letters("orders") == []


async def test_what_a_handler_produces_can_be_asserted() -> None:
    """A handler's own producer on the TestApp's transport writes to a topic the test reads."""
    spec = TopicSpec.model_validate({"name": "payments", "partitions": 2})
    app = App([spec])
    outbox: list[object] = []

    @app.handler("payments")
    async def pay(event: Order, ctx: Context) -> None:
        await outbox[0].send("receipts", event.order_id.encode(), key=ctx.message.key)  # type: ignore[attr-defined]

    async with TestApp(app) as t:
        await t.transport.admin().create_topic(TopicConfig("receipts", 2))
        outbox.append(t.transport.producer())
        await t.send("payments", Order(order_id="p1"), key="p1")
        await t.drain()
        (receipt,) = t.messages("receipts")
        assert (receipt.key, receipt.value) == (b"p1", b"p1")


async def test_a_bad_payload_is_dead_lettered_without_running_the_handler() -> None:
    """JSON that does not validate never reaches the handler and lands in the DLQ, fatal."""
    calls: list[str] = []
    async with TestApp(orders_app(calls)) as t:
        await t.send("orders", {"no_order_id": True}, key="x")
        await t.drain()
        assert calls == []
        (dead,) = t.dead_letters("orders")
        assert dead.reason == "fatal"
        assert dead.error_class is not None
        assert dead.error_class.endswith("ValidationError")


def test_the_member_of_a_stopped_test_app_is_a_clear_error() -> None:
    """Asking for the member outside `async with` says how to start it."""
    with pytest.raises(ConfigError, match="async with TestApp"):
        _ = TestApp(orders_app([])).member


async def test_a_cancelled_run_has_outcome_cancelled_and_a_hung_one_failed() -> None:
    """A run app.cancel stopped has outcome cancelled, as the runtime says; a hung one failed."""
    spec = TopicSpec.model_validate(
        {"name": "work", "partitions": 2, "retry": {"tiers": ["1s"]}, "heartbeat_timeout": "5s"}
    )
    app = App([spec])

    @app.handler("work")
    async def handle(event: Order, ctx: Context) -> None:
        ctx.heartbeat()  # from now on only the handler's own beats count
        if ctx.attempt == 1:
            await asyncio.sleep(600)

    async with TestApp(app) as t:
        await t.send("work", Order(order_id="hangs"), key="k1", event_id="e1")
        await t.send("work", Order(order_id="cancelled"), key="k2", event_id="e2")
        await t.advance(1)
        await app.cancel(t.redis, event="e2", prefix=t.settings.redis.key_prefix)
        await t.drain()
        outcomes = [(r.event.order_id, r.attempt, r.outcome) for r in t.runs("work")]
        assert sorted(outcomes) == [
            ("cancelled", 1, "cancelled"),
            ("hangs", 1, "failed"),
            ("hangs", 2, "handled"),
        ]
        assert (t.stats.cancelled, t.stats.hung) == (1, 1)


async def test_an_unknown_lane_is_a_clear_error_naming_the_lanes() -> None:
    """A lane the App has no handler for, given to lanes= or asked about, is a ConfigError."""
    with pytest.raises(ConfigError, match=r"no handler registered for lane\(s\) nope"):
        TestApp(orders_app([]), lanes=["nope"])
    async with TestApp(orders_app([])) as t:
        with pytest.raises(ConfigError, match=r"no lane 'oders' in this TestApp \(lanes: orders\)"):
            t.dead_letters("oders")
        with pytest.raises(ConfigError, match=r"no lane 'oders' in this TestApp \(lanes: orders\)"):
            t.retried("oders")


async def test_messages_and_retries_are_listed_in_produce_order() -> None:
    """Messages produced in one virtual millisecond are listed as sent, not by partition."""
    async with TestApp(orders_app([])) as t:
        sent = [f"o{i}" for i in range(8)]
        for order_id in sent:  # keys spread over the 4 partitions, all in the same millisecond
            await t.send("orders", Order(order_id=order_id, fail_times=1), key=order_id)
        await t.drain()
        assert [Order.model_validate_json(m.value).order_id for m in t.messages("orders")] == sent
        retried = [Order.model_validate_json(m.value).order_id for m in t.retried("orders")]
        assert retried == [r.event.order_id for r in t.runs("orders") if r.attempt == 1]


async def test_peak_concurrency_counts_calls_that_took_no_virtual_time() -> None:
    """A call that returned in the virtual instant it started still ran: the peak is 1, not 0."""
    async with TestApp(orders_app([])) as t:
        for order_id in ("a", "b", "c"):
            await t.send("orders", Order(order_id=order_id), key=order_id, tenant="acme")
        await t.drain()
        assert [r.ended_s == r.started_s for r in t.runs("orders")] == [True, True, True]
        assert t.peak_concurrency("orders") == 1
        assert t.peak_concurrency("orders", tenant="acme") == 1


async def test_asking_what_ran_on_an_unknown_lane_is_a_clear_error() -> None:
    """runs, handled and peak_concurrency of a misspelt lane raise, not answer an empty list."""
    async with TestApp(orders_app([])) as t:
        await t.send("orders", Order(order_id="o1"), key="o1")
        await t.drain()
        for ask in (t.runs, t.handled, t.peak_concurrency):
            with pytest.raises(ConfigError, match=r"no lane 'oders' in this TestApp"):
                ask("oders")


async def test_how_busy_the_machine_running_the_test_is_does_not_change_concurrency(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host under CPU pressure does not shrink a TestApp's concurrency: results are the same."""
    monkeypatch.setattr(LinuxProbe, "read", lambda _probe: Pressure(cpu_psi=99.0))
    spec = TopicSpec.model_validate({"name": "slow", "partitions": 4})
    app = App([spec])

    @app.handler("slow")
    async def handle(event: Order, ctx: Context) -> None:
        await asyncio.sleep(10)

    async with TestApp(app) as t:
        most = t.settings.runtime.max_concurrency
        for burst in ("a", "b"):
            await t.advance(60)  # the member idles a while between bursts
            for order_id in [f"{burst}{i}" for i in range(most)]:
                await t.send("slow", Order(order_id=order_id), key=order_id)
            await t.drain()
        second = t.recorder.peak_concurrency("slow", lambda r: r.event.order_id[0] == "b")
        assert second == most


async def test_a_text_header_value_arrives_as_bytes_as_on_the_real_transports() -> None:
    """A str header given to send is stored as UTF-8 bytes, as Kafka and Redis Streams do."""
    async with TestApp(orders_app([])) as t:
        await t.send(
            "orders", Order(order_id="o1", fail_times=1), key="o1", headers={"x-trace": "ü1"}
        )  # type: ignore[dict-item]
        await t.drain()
        assert [(r.attempt, r.outcome) for r in t.runs("orders")] == [(1, "failed"), (2, "handled")]
        assert [m.headers["x-trace"] for m in t.retried("orders")] == ["ü1".encode()]
