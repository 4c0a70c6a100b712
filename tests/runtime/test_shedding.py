"""Shedding on both brokers: a lane's max age, its standing-queue limit, its retry budget."""

from __future__ import annotations

import asyncio
import time

from contract.helpers import consume_until
from runtime.helpers import FAST, declare, eventually, lane_spec, running

from pipeline import headers as h
from pipeline.config import RuntimeSettings
from pipeline.envelope import Message, Record
from pipeline.errors import Retry
from pipeline.retry.budget import RetryBudget
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.runtime.sojourn import StandingQueue
from pipeline.topics.spec import RetryBudgetPolicy, SojournPolicy
from pipeline.transport.protocol import Transport


def test_a_busy_queue_that_drains_is_not_standing() -> None:
    """Waiting above the target for less than an interval sheds nothing."""
    queue = StandingQueue(SojournPolicy.model_validate({"target": "10ms", "interval": "100ms"}))
    assert all(queue.admit(500, now_ms) for now_ms in range(0, 90, 10))
    assert queue.admit(5, 95)  # a message started within the target: the queue drained
    assert all(queue.admit(500, now_ms) for now_ms in range(100, 190, 10))
    assert queue.shed == 0


def test_a_standing_queue_sheds_only_what_waited_longer_than_brief() -> None:
    """Above the target for a whole interval, long waiters are shed and brief ones still run."""
    policy = SojournPolicy.model_validate({"target": "10ms", "interval": "100ms", "brief": "20ms"})
    queue = StandingQueue(policy)
    assert queue.admit(500, 0)
    assert not queue.admit(500, 100)  # standing now: a 500 ms wait is shed
    assert queue.admit(15, 110)  # above target but within brief: runs
    assert queue.admit(5, 120)  # below target: the queue is no longer standing
    assert queue.admit(500, 130)
    assert queue.shed == 1


def test_the_retry_budget_is_earned_by_traffic_and_refilled_by_the_floor() -> None:
    """Retries are limited to the ratio of processed messages plus the per-second floor."""
    now = [0.0]
    budget = RetryBudget(RetryBudgetPolicy(ratio=0.1, min_per_s=0.0), clock=lambda: now[0])
    assert budget.try_spend()  # one token to start with
    assert not budget.try_spend()
    for _ in range(20):
        budget.processed()
    assert budget.try_spend()
    assert budget.try_spend()
    assert not budget.try_spend()
    floor = RetryBudget(RetryBudgetPolicy(ratio=0.1, min_per_s=2.0), clock=lambda: now[0])
    spent = sum(floor.try_spend() for _ in range(100))
    assert spent == 20  # ten seconds of the floor
    now[0] += 1.0
    assert sum(floor.try_spend() for _ in range(100)) == 2
    assert floor.exhausted == 80 + 98


async def test_messages_older_than_the_lane_max_age_are_dead_lettered(
    transport: Transport, unique: str
) -> None:
    """A message that waited past max_age behind a slow one goes to the DLQ as expired."""
    spec = lane_spec(f"maxage_{unique}", 1, max_age="3s", on_expiry="dead_letter")
    await declare(transport, spec)
    app = App([spec])
    handled: list[bytes] = []
    sent_at = [0.0]

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"slow":
            # The work itself is slow: it ends past the next message's max age however late it
            # started (it had the whole max age to start: a loaded machine's delay is no expiry).
            await asyncio.sleep(max(0.0, sent_at[0] + 3.5 - time.time()))
        handled.append(event)

    producer = transport.producer()
    member = Member(app, transport, f"g-{unique}", FAST)
    async with running(member):
        await eventually(lambda: bool(member.assignment))  # ages count from here, not the join
        sent_at[0] = time.time()
        await producer.send_many(spec.name, [Record(b"slow", b"k"), Record(b"late", b"k")])
        await eventually(lambda: member.stats.handled == 1 and member.stats.dead_lettered == 1)
    dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
    dead = await consume_until(dlq, lambda got: len(got) == 1)
    await dlq.close()
    await producer.close()
    assert handled == [b"slow"]
    assert dead[0].value == b"late"
    assert dead[0].headers[h.DEAD_REASON] == b"expired"
    assert member.stats.expired == 1


async def test_a_standing_queue_sheds_the_backlog_and_keeps_serving(
    transport: Transport, unique: str
) -> None:
    """With one slow worker and a standing queue, old work is shed instead of run late."""
    spec = lane_spec(
        f"sojourn_{unique}",
        1,
        ordered=False,
        sojourn={"target": "20ms", "interval": "100ms", "brief": "20ms"},
    )
    await declare(transport, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        await asyncio.sleep(0.05)  # simulated work keeps the single worker busy

    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"%d" % i, b"k%d" % i) for i in range(40)])
    await producer.close()
    settings = RuntimeSettings(max_concurrency=1, commit_interval_ms=100, shutdown_grace_s=5.0)
    member = Member(app, transport, f"g-{unique}", settings)
    async with running(member):
        await eventually(lambda: member.stats.handled + member.stats.shed == 40)
    assert member.stats.handled >= 1
    assert member.stats.shed >= 1
    assert member.stats.dead_lettered == 0  # on_expiry defaults to drop


async def test_failures_past_the_retry_budget_skip_to_the_longest_tier(
    transport: Transport, unique: str
) -> None:
    """Once the budget is spent, retries go to the longest tier instead of the first."""
    spec = lane_spec(
        f"budget_{unique}",
        1,
        ordered=False,
        retry={"tiers": ["100ms", "1h"], "budget": {"ratio": 0.1, "min_per_s": 0}},
    )
    await declare(transport, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        if ctx.attempt == 1:
            raise Retry("dependency is down")

    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"%d" % i, b"k%d" % i) for i in range(10)])
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST)
    async with running(member):
        await eventually(lambda: member.stats.retried == 10)
    longest = spec.retry_topic_names()[-1]
    tier = transport.consumer(f"tier-{unique}", [longest])
    parked = await consume_until(tier, lambda got: len(got) == member.stats.budget_exhausted)
    await tier.close()
    assert member.stats.budget_exhausted >= 8
    assert all(m.headers[h.ATTEMPT] == b"2" for m in parked)
