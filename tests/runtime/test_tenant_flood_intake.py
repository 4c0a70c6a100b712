"""One tenant's flood must not hold another tenant's messages behind it inside a member.

Three ways it did, each seen with `pipeline consume` of a throttled, ordered lane with retry
tiers (one member, 32 slots, a 20 ms handler, a small tenant at 100 msgs/s, another tenant's
3,000 messages at once): the small tenant's p99 wait went from about 8 ms to 0.4-0.6 s (flood
over 3,000 keys) or 6-7.5 s (flood over 5 keys).

* every flood head asked Redis at once: thousands of acquisitions in one write, and the small
  tenant's acquisition behind all of them in Redis (the gate now keeps at most
  ``ASKING_AT_ONCE`` of one set of keys asking);
* deferrals took the workers, in the order they came, from messages read after them, and a
  deferred copy coming back was deferred again (13,404 deferrals for 3,000 messages);
* a flood on a few keys filled its partition's buffer and paused it, every other tenant's
  messages unread behind it until those keys had run their backlog one at a time (the gate now
  sends a full partition's longest waiting keys away: parked in Redis behind a deferred head).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running
from support import own_throttle

from pipeline import headers as h
from pipeline.admission.throttle import Throttle
from pipeline.config import RuntimeSettings
from pipeline.envelope import Message, Record, TopicPartition
from pipeline.runtime import App, Context
from pipeline.runtime.lanes import KeyLanes
from pipeline.runtime.member import Member
from pipeline.runtime.throttle_gate import ASKING_AT_ONCE, ThrottleGate
from pipeline.topics.spec import ThrottlePolicy
from pipeline.transport.protocol import Transport

throttle = own_throttle(default_limit=1)
"""A started throttle in a namespace of the test's own: one slot per tenant."""

POLICY = ThrottlePolicy.model_validate({"keys": ["org:{tenant}"]})


def _message(tenant: str, offset: int, partition: int = 0) -> Message:
    return Message("flood", partition, offset, b"k%d" % offset, b"{}", {h.TENANT: tenant.encode()})


@pytest.mark.redis
async def test_a_flood_keeps_only_so_many_heads_asking_and_another_tenant_asks_at_once(
    throttle: Throttle,
) -> None:
    """60 heads of acme (one slot): Redis holds at most ASKING_AT_ONCE of them; beta goes by.

    Before, all 60 asked in one write, and beta's acquisition waited behind them in Redis.
    """
    admitted: list[Message] = []
    gate: ThrottleGate[Message] = ThrottleGate(throttle, admitted.append, admitted.append)
    for n in range(60):
        gate.offer(_message("acme", n), POLICY, "flood", ordered=False, busy=False, can_defer=False)
    gate.offer(_message("beta", 60), POLICY, "flood", ordered=False, busy=False, can_defer=False)

    def acme() -> list[Message]:
        return [m for m in admitted if m.offset != 60]

    try:
        await eventually(lambda: len(admitted) == 2, 30)  # acme's one slot, and beta's
        assert {m.offset for m in admitted} == {0, 60}
        status = await throttle.status("org:acme")
        assert 0 < len(status.waiters) <= ASKING_AT_ONCE
        for n in range(1, 60):  # each end lets the next acme head in, until all ran
            gate.finished(acme()[-1])
            await eventually(lambda n=n: len(acme()) == n + 1, 30)  # type: ignore[misc]
        assert sorted(m.offset for m in admitted) == list(range(61))
    finally:
        await gate.close()


@pytest.mark.redis
async def test_heads_held_back_of_a_revoked_partition_never_ask(throttle: Throttle) -> None:
    """Revoked while held back from asking, a head does not ask once its group has room."""
    admitted: list[Message] = []
    gate: ThrottleGate[Message] = ThrottleGate(throttle, admitted.append, admitted.append)
    kept = [_message("acme", n, partition=0) for n in range(ASKING_AT_ONCE)]
    revoked = [_message("acme", n, partition=1) for n in range(10)]
    for message in [*kept, *revoked]:
        gate.offer(message, POLICY, "flood", ordered=False, busy=False, can_defer=False)
    try:
        await eventually(lambda: len(admitted) == 1, 30)
        gate.drop([TopicPartition("flood", 1)])
        assert gate.waiting == ASKING_AT_ONCE - 1
        for _ in range(ASKING_AT_ONCE - 1):
            done = len(admitted)
            gate.finished(admitted[-1])
            await eventually(lambda done=done: len(admitted) == done + 1, 30)  # type: ignore[misc]
        gate.finished(admitted[-1])
        await gate.released()
        assert [m.partition for m in admitted] == [0] * ASKING_AT_ONCE
        status = await throttle.status("org:acme")
        assert not status.waiters
        assert not status.holders
    finally:
        await gate.close()


async def test_work_that_only_leaves_waits_for_the_keys_with_work_to_run() -> None:
    """One worker: the leaving keys (deferrals) run after the keys queued behind them.

    Up to ``LEAVING_EVERY - 1`` runs in a row: then a leaving key takes its turn (see
    tests/runtime/test_lanes_leaving_bound.py).
    """
    order: list[str] = []
    gate = asyncio.Event()

    async def process(message: Message) -> None:
        if message.value == b"first":
            await gate.wait()
        order.append(message.value.decode())

    lanes: KeyLanes[Message] = KeyLanes(process, 1)
    lanes.start()
    try:

        def message(key: str, value: str) -> Message:
            return Message("t", 0, 0, key.encode(), value.encode(), {})

        lanes.submit(message("a", "first"), ordered=True)
        await asyncio.sleep(0)  # the worker takes "first" and waits in it
        lanes.submit(message("d1", "leaving-1"), ordered=True, leaving=True)
        lanes.submit(message("b", "run-1"), ordered=True)
        lanes.submit(message("d2", "leaving-2"), ordered=True, leaving=True)
        lanes.submit(message("c", "run-2"), ordered=True)
        gate.set()
        await lanes.wait_idle()
        assert order == ["first", "run-1", "run-2", "leaving-1", "leaving-2"]
    finally:
        await lanes.close(5)


def _record(tenant: str, key: str, n: int) -> Record:
    return Record(b"%s:%d" % (tenant.encode(), n), key.encode(), {h.TENANT: tenant.encode()})


async def test_a_deferred_copy_is_not_deferred_again(
    transport: Transport, throttle: Throttle, redis_service: str, unique: str
) -> None:
    """Past ``max_waiting``, acme's messages go through the delay tier once each, no more.

    Before, a copy back from the tier while acme still waited past the bound was deferred
    again, and again: each round a produce, a Redis call and a worker, for nothing.
    """
    spec = lane_spec(
        f"floodonce_{unique}",
        1,
        ordered=False,
        retry={"tiers": ["200ms"]},
        throttle={"keys": ["org:{tenant}"], "max_waiting": 3},
    )
    await declare(transport, spec)
    app = App([spec])
    handled: list[bytes] = []

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        await asyncio.sleep(0.03)
        handled.append(event.value)

    await produce(transport, spec.name, [_record("acme", f"a{n}", n) for n in range(20)])
    member = Member(app, transport, f"g-{unique}", FAST, throttle=throttle)
    async with running(member):
        await eventually(lambda: len(handled) == 20)
    assert sorted(handled) == sorted(b"acme:%d" % n for n in range(20))
    assert 1 <= member.stats.deferred <= 20 - 3


async def test_a_flood_on_few_keys_does_not_keep_another_tenant_unread_behind_it(
    transport: Transport, throttle: Throttle, redis_service: str, unique: str
) -> None:
    """Acme's 80 messages on 2 keys fill the partition's buffer; beta's 4 behind them go by.

    A buffer of 20 messages, acme one slot, 20 ms a message: held in the member, acme's keys
    kept the partition paused until they had run down to 10 waiting, again and again, and
    beta's messages (produced after acme's) ran only after about 70 of acme's. Now the full
    partition sends acme's waiting messages away (parked in Redis behind a deferred head,
    released in order), so beta runs early, and each acme key still runs in produce order.
    """
    spec = lane_spec(
        f"floodfew_{unique}",
        1,
        retry={"tiers": ["200ms"]},
        throttle={"keys": ["org:{tenant}"]},
    )
    await declare(transport, spec)
    app = App([spec])
    handled: list[bytes] = []
    by_key: dict[bytes, list[int]] = defaultdict(list)

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        if event.value.startswith(b"acme"):
            await asyncio.sleep(0.02)
        handled.append(event.value)
        by_key[event.key or b""].append(int(event.value.split(b":")[1]))

    acme = [_record("acme", f"a{n % 2}", n) for n in range(80)]
    beta = [_record("beta", f"b{n}", n) for n in range(4)]
    await produce(transport, spec.name, [*acme, *beta])
    settings = FAST.model_copy(update={"partition_high_water": 20, "partition_low_water": 10})
    assert isinstance(settings, RuntimeSettings)
    redis = Redis.from_url(redis_service)
    member = Member(
        app,
        transport,
        f"g-{unique}",
        settings,
        throttle=throttle,
        redis=redis,
        redis_prefix=f"t{unique}",
    )
    try:
        async with running(member):
            await eventually(lambda: len(handled) == 84)
    finally:
        await redis.aclose()
    beta_done = max(handled.index(b"beta:%d" % n) for n in range(4))
    acme_before = sum(1 for value in handled[:beta_done] if value.startswith(b"acme"))
    assert acme_before < 40, handled
    for key in (b"a0", b"a1"):
        assert by_key[key] == sorted(by_key[key]), key
        assert len(by_key[key]) == 40
    assert member.stats.deferred >= 1
