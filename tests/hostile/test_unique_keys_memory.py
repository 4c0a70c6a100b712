"""A flood of distinct keys, tenants and conversations leaves nothing behind in the member.

A hostile or very wide producer sends every message with a new key, a new ``pl-tenant`` and a
new conversation. A member on Kafka and Redis consumes a throttled lane (``org:{tenant}``, with
a retry tier and per-key order, so a fifth of the keys park once and retry) and a debounced lane
(a conversation a message) with dynamic limits on. Once every message is done and the member
has idled for a few reap ticks, each structure it keeps per key, tenant, conversation or
message (:mod:`flood_entries`) is empty, and the keys it remembers as maybe parked stay below
their own bound.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from flood_entries import PER_KEY, entries, member_ticks
from pydantic import BaseModel
from redis.asyncio import Redis
from runtime.guard_parts import guarded_lane, main_message, parking_calls_time_out, routing_guard
from runtime.helpers import FAST, declare, eventually, join, lane_spec, produce, running
from runtime.owned import prefix

from pipeline import headers as h
from pipeline.admission.fleet import FleetLimits
from pipeline.admission.limits import LimitPolicy
from pipeline.admission.throttle import Throttle
from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.errors import Retry
from pipeline.runtime import App, Context
from pipeline.runtime import claims as claims_module
from pipeline.runtime.claims import FORGET_PARKED_ABOVE
from pipeline.runtime.member import Member
from pipeline.runtime.run import redis_client
from pipeline.transport.protocol import Transport

KEYS = 2_000
"""Distinct keys (each its own tenant) on the throttled lane."""
CONVERSATIONS = 1_000
"""Distinct conversations on the debounced lane."""
FAILING = 200
"""Distinct keys whose parking calls time out."""

__all__ = ["prefix"]  # the fixture: a key prefix of the test's own, its keys deleted after


class Said(BaseModel):
    """One message of a conversation."""

    conversation_id: str
    n: int


@pytest.fixture
async def member_redis(settings: Settings, redis_service: str) -> AsyncIterator[Redis]:
    """A Redis client as ``pipeline consume`` makes it (a blocking pool of its own)."""
    client = redis_client(settings)
    yield client
    await client.aclose()


@pytest.fixture
async def throttle(member_redis: Redis, unique: str) -> AsyncIterator[Throttle]:
    """A started throttle in a namespace of the test's own."""
    limiter = Throttle(member_redis, prefix=f"t{unique}", namespace=unique, default_limit=4)
    await limiter.start()
    yield limiter
    await limiter.close()


def tenant_message(n: int) -> Record:
    """Message ``n``: its own key and its own tenant."""
    return Record(b'{"n": %d}' % n, b"key-%d" % n, headers={h.TENANT: b"tenant-%d" % n})


def conversation_message(n: int) -> Record:
    """Message ``n``: its own key, tenant and conversation."""
    body = Said(conversation_id=f"conv-{n}", n=n).model_dump_json().encode()
    return Record(body, b"conv-%d" % n, headers={h.TENANT: b"tenant-c%d" % n})


async def test_a_flood_of_distinct_keys_leaves_no_entry_once_done(
    kafka: Transport, member_redis: Redis, throttle: Throttle, unique: str
) -> None:
    """After 2,000 keys/tenants (a fifth retried once) and 1,000 conversations: nothing kept."""
    throttled = lane_spec(
        f"flood_thr_{unique}",
        3,
        throttle={"keys": ["org:{tenant}"]},
        retry={"tiers": ["100ms"], "max_attempts": 3},
    )
    debounced = lane_spec(
        f"flood_deb_{unique}",
        3,
        debounce={"key": "conversation_id", "quiet_s": 0.1, "max_wait_s": 1},
        retry={"tiers": ["100ms"], "max_attempts": 3},
    )
    await declare(kafka, throttled, debounced)
    app = App([throttled, debounced])
    done: set[int] = set()
    turns: set[str] = set()

    @app.handler(throttled.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        n = json.loads(event)["n"]
        if n % 5 == 0 and ctx.attempt == 1:
            raise Retry("once, to park the key and retry it")
        done.add(n)

    @app.handler(debounced.lane)
    async def turn(events: list[Said], ctx: Context) -> None:
        turns.update(e.conversation_id for e in events)

    await produce(kafka, throttled.name, [tenant_message(n) for n in range(KEYS)])
    await produce(kafka, debounced.name, [conversation_message(n) for n in range(CONVERSATIONS)])
    fleet = FleetLimits(
        member_redis, f"t{unique}", throttle, LimitPolicy(), member=throttle.member, interval_s=0.2
    )
    member = Member(
        app,
        kafka,
        f"g-{unique}",
        FAST,
        redis=member_redis,
        redis_prefix=f"t{unique}",
        throttle=throttle,
        fleet=fleet,
    )
    async with running(member):
        await eventually(lambda: len(done) == KEYS and len(turns) == CONVERSATIONS, 180)
        # Idle for three reap ticks (the guard's tick: one in 20 commit ticks of 100 ms).
        ticks = member_ticks(member)
        await eventually(lambda: member_ticks(member) >= ticks + 60, 60)
        left = entries(member, throttle, fleet)
    assert {name: left[name] for name in PER_KEY if left[name]} == {}
    assert left["claims.maybe_parked"] <= FORGET_PARKED_ABOVE


async def test_keys_of_parking_calls_that_failed_are_let_go_after_their_bound(
    redis: Redis, unique: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outage during a flood of distinct keys leaves no key remembered for ever.

    Each key's head fails while Redis does not answer: its route and its parking end time out,
    so the key is remembered as maybe parked (the call may still reach Redis). None of the
    keys has a later message. A reading right away keeps them all; the next reading (once
    twice as many keys are known) after the bound (:data:`~pipeline.runtime.claims.UNSURE_KEPT_S`)
    has passed since the failures, not finding them parked, forgets them. Before, they stayed
    for as long as the member lived: the keys of the calls that failed were kept through every
    reading.
    """
    monkeypatch.setattr(claims_module, "FORGET_PARKED_ABOVE", 1)
    lane = guarded_lane(f"flood_unsure_{unique}")
    guard, _ = routing_guard(redis, prefix, lane, b"x", claims=True)
    heads = [main_message(lane, i, b"x%d" % i, key=b"key-%d" % i) for i in range(FAILING)]
    await join(guard, lane, heads)
    store = guard._stores[lane.name]

    parking_calls_time_out(monkeypatch, store)
    for head in heads:
        assert await guard.run(lane, head) == "retried"
    monkeypatch.undo()
    monkeypatch.setattr(claims_module, "FORGET_PARKED_ABOVE", 1)
    claims = guard._claims[lane.name]
    await guard.tick({lane.name: lane})
    assert len(claims.maybe_parked or ()) == FAILING  # within the bound: kept
    monkeypatch.setattr(claims_module, "UNSURE_KEPT_S", 0.0, raising=False)
    monkeypatch.setattr(claims, "_unsure_kept_s", 0.0)  # and the lane's retry path
    for n in range(2 * FAILING + 1):  # the flood goes on: past twice what the reading kept
        claims.decided(f"later-{n}", "held")
    await guard.tick({lane.name: lane})
    assert (len(claims.maybe_parked or ()), len(claims._unsure)) == (0, 0)
