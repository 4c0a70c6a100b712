"""Throttled lanes on both brokers: per-tenant limits hold, order holds, waiting is bounded."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict

from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running, vision_lane
from support import own_throttle

from pipeline import headers as h
from pipeline.admission.fleet import FleetLimits
from pipeline.admission.limits import LimitPolicy, OrgLimits
from pipeline.admission.throttle import Throttle
from pipeline.envelope import Message, Position, Record, TopicPartition
from pipeline.errors import Throttled
from pipeline.observability.facades import AdmissionMetrics
from pipeline.observability.metrics import Metrics
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.runtime.throttle_gate import throttle_keys
from pipeline.topics.spec import ThrottlePolicy
from pipeline.transport.protocol import Transport

throttle = own_throttle(default_limit=2)
"""A started throttle in a namespace of the test's own: two slots per tenant."""


def record(tenant: str, n: int, key: str | None = None) -> Record:
    """A message of ``tenant`` numbered ``n``."""
    body = b'{"n": %d, "customer_id": "c%d"}' % (n, n % 2)
    return Record(body, (key or f"{tenant}-{n}").encode(), headers={h.TENANT: tenant.encode()})


def metered(
    app: App, transport: Transport, unique: str, throttle: Throttle
) -> tuple[Member, Metrics]:
    """A member of the test's group admitting through ``throttle``, with its admission metrics."""
    metrics = Metrics()
    member = Member(
        app,
        transport,
        f"g-{unique}",
        FAST,
        throttle=throttle,
        admission_metrics=AdmissionMetrics(metrics),
    )
    return member, metrics


def test_key_templates_take_the_tenant_header_and_event_fields() -> None:
    """Templates are filled from the tenant header and JSON fields; missing ones are left out."""
    policy = ThrottlePolicy(keys=("org:{tenant}", "sub:{tenant}/{customer_id}", "doc:{doc}"))
    message = Message("t", 0, 0, b"k", b'{"customer_id": "c9"}', {h.TENANT: b"acme"})
    assert throttle_keys(policy, "lane", message) == ["org:acme", "sub:acme/c9"]


def test_two_tenants_never_share_a_key_of_a_template_with_two_fields() -> None:
    """A value holding the template's separator is escaped, so no two messages' keys meet."""
    policy = ThrottlePolicy(keys=("org:{tenant}", "sub:{tenant}/{customer_id}"))
    first = Message("t", 0, 0, b"k", b'{"customer_id": "c"}', {h.TENANT: b"a/b"})
    second = Message("t", 0, 1, b"k", b'{"customer_id": "b/c"}', {h.TENANT: b"a"})
    third = Message("t", 0, 2, b"k", b'{"customer_id": "b%2Fc"}', {h.TENANT: b"a"})
    keys = [throttle_keys(policy, "lane", m) for m in (first, second, third)]
    assert keys == [
        ["org:a/b", "sub:a%2Fb/c"],
        ["org:a", "sub:a/b%2Fc"],
        ["org:a", "sub:a/b%252Fc"],
    ]


async def test_a_tenant_never_runs_more_than_its_limit(
    transport: Transport, throttle: Throttle, unique: str
) -> None:
    """At most the tenant's limit of its messages run at once; every tenant gets its slots."""
    spec = lane_spec(f"thr_{unique}", 2, ordered=False, throttle={"keys": ["org:{tenant}"]})
    await declare(transport, spec)
    app = App([spec])
    running_now: Counter[str] = Counter()
    peak: Counter[str] = Counter()

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        tenant = ctx.tenant or ""
        running_now[tenant] += 1
        peak[tenant] = max(peak[tenant], running_now[tenant])
        await asyncio.sleep(0.02)  # simulated work holds the slot
        running_now[tenant] -= 1

    await throttle.set_limit("org:acme", 3)
    producer = transport.producer()
    records = [record("acme", n) for n in range(30)] + [record("beta", n) for n in range(10)]
    await producer.send_many(spec.name, records)
    await producer.close()
    member, metrics = metered(app, transport, unique, throttle)
    waiting = {"lane": spec.lane}
    async with running(member):
        await eventually(lambda: member.stats.handled == 40)
        # The waiting gauge is published on each commit tick and drains to zero.
        await eventually(
            lambda: metrics.registry.get_sample_value("pipeline_throttle_waiting", waiting) == 0
        )
        # Each message's admission, counted on the same tick.
        await eventually(
            lambda: (
                metrics.registry.get_sample_value("pipeline_throttle_grants_total", waiting) == 40
            )
        )
    assert metrics.registry.get_sample_value("pipeline_throttle_fail_open_total", waiting) is None
    assert peak["acme"] <= 3, (peak, throttle.fail_open, throttle.lost, throttle.acquired)
    assert peak["beta"] <= 2
    assert throttle.waited > 0  # the limit was actually contended


async def test_admissions_let_through_with_redis_down_are_counted(
    transport: Transport, unique: str
) -> None:
    """A throttle whose Redis cannot be reached fails open, and the member counts each one.

    ``pipeline_throttle_fail_open_total`` was declared and documented but never written.
    """
    spec = lane_spec(f"thropen_{unique}", 1, ordered=False, throttle={"keys": ["org:{tenant}"]})
    await declare(transport, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        """Runs: the throttle let it through."""

    client = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    down = Throttle(client, prefix=f"t{unique}", namespace=unique, wake_block_s=0.2)
    await down.start()
    await produce(transport, spec.name, [record("acme", n) for n in range(5)])
    member, metrics = metered(app, transport, unique, down)
    lane = {"lane": spec.lane}
    try:
        async with running(member):
            await eventually(lambda: member.stats.handled == 5)
            await eventually(
                lambda: (
                    metrics.registry.get_sample_value("pipeline_throttle_fail_open_total", lane)
                    == 5
                )
            )
    finally:
        await down.close()
        await client.aclose()
    assert metrics.registry.get_sample_value("pipeline_throttle_grants_total", lane) is None


async def test_a_throttled_ordered_lane_keeps_per_key_order(
    transport: Transport, throttle: Throttle, unique: str
) -> None:
    """Waiting for a slot blocks only its own key, and each key still runs in produce order."""
    spec = lane_spec(f"thrord_{unique}", 2, throttle={"keys": ["org:{tenant}"]})
    await declare(transport, spec)
    app = App([spec])
    seen: dict[bytes, list[int]] = defaultdict(list)

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        await asyncio.sleep(0.002)
        seen[event.key or b""].append(int(event.value.split(b":")[1].split(b",")[0]))

    await throttle.set_limit("org:acme", 1)
    producer = transport.producer()
    await producer.send_many(spec.name, [record("acme", n, key=f"k{n % 5}") for n in range(50)])
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST, throttle=throttle)
    async with running(member):
        await eventually(lambda: member.stats.handled == 50)
    assert all(values == sorted(values) for values in seen.values())
    assert sum(len(v) for v in seen.values()) == 50


async def test_beyond_max_waiting_the_flooding_tenant_is_deferred_not_held(
    transport: Transport, throttle: Throttle, unique: str
) -> None:
    """Past the waiting bound, the tenant waiting most goes through the delay tier; others don't."""
    spec = lane_spec(
        f"thrdef_{unique}",
        1,
        ordered=False,
        retry={"tiers": ["200ms"]},
        throttle={"keys": ["org:{tenant}"], "max_waiting": 3},
    )
    await declare(transport, spec)
    app = App([spec])
    topics: dict[str, list[str]] = defaultdict(list)

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        topics[ctx.tenant or ""].append(event.topic)
        await asyncio.sleep(0.01)

    await throttle.set_limit("org:acme", 1)
    producer = transport.producer()
    flood = [record("acme", n) for n in range(20)]
    await producer.send_many(spec.name, [*flood, record("beta", 0), record("beta", 1)])
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST, throttle=throttle)
    async with running(member):
        await eventually(lambda: member.stats.handled == 22)
    assert member.stats.deferred >= 1
    assert topics["beta"] == [spec.name, spec.name]  # never sent through the delay tier


async def test_each_lane_keeps_its_own_waiting_bound(
    transport: Transport, throttle: Throttle, unique: str
) -> None:
    """Two throttled lanes flooded at once: each defers past its own ``max_waiting``.

    A lane's bound counts its own waiting messages: counted over the member's whole gate, each
    flooding tenant held less than its share of the total and nothing was deferred, so the two
    floods waited in memory without bound.
    """
    specs = [
        lane_spec(
            f"thrtwo{side}_{unique}",
            1,
            ordered=False,
            retry={"tiers": ["200ms"]},
            throttle={"keys": ["org:{tenant}"], "max_waiting": 3},
        )
        for side in ("a", "b")
    ]
    for spec in specs:
        await declare(transport, spec)
    app = App(specs)
    topics: dict[str, list[str]] = defaultdict(list)

    for spec in specs:

        @app.handler(spec.lane)
        async def handle(event: Message, ctx: Context) -> None:
            topics[ctx.lane].append(event.topic)
            await asyncio.sleep(0.01)

    await throttle.set_limit("org:acme", 1)
    await throttle.set_limit("org:gamma", 1)
    await produce(transport, specs[0].name, [record("acme", n) for n in range(20)])
    await produce(transport, specs[1].name, [record("gamma", n) for n in range(20)])
    member = Member(app, transport, f"g-{unique}", FAST, throttle=throttle)
    async with running(member):
        await eventually(lambda: member.stats.handled == 40)
    for spec in specs:  # some of each flood went through its lane's delay tier
        assert any(topic != spec.name for topic in topics[spec.lane]), spec.lane


async def test_a_dependency_that_answers_429_gets_fewer_calls_from_the_fleet(
    transport: Transport, throttle: Throttle, unique: str
) -> None:
    """A 429 (``Throttled`` with a Retry-After) cuts the dependency key's limit.

    The key is closed until the Retry-After passed, the message is retried, and successes grow
    the limit back.
    """
    spec = vision_lane(f"thrdep_{unique}", max_attempts=5)
    await declare(transport, spec)
    app = App([spec])
    calls: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        n = int(event.value.split(b":")[1].split(b",")[0])
        calls.append(n)
        if n == 0 and ctx.attempt == 1:
            raise Throttled(retry_after_s=0.5, dependency="vision")

    await throttle.set_limit("dep:vision", 4)
    await throttle.set_limit("org:acme", 8)
    producer = transport.producer()
    await producer.send_many(spec.name, [record("acme", 0)])
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST, throttle=throttle)
    async with running(member):
        await eventually(lambda: member.stats.handled == 1)  # the retry, once the key reopened
        producer = transport.producer()
        await producer.send_many(spec.name, [record("acme", n) for n in range(1, 9)])
        await producer.close()
        await eventually(lambda: member.stats.handled == 9)
    assert calls.count(0) == 2
    assert not member._handler._calls  # every call recorded for feedback was reported
    # Cut to 2 (4 * 0.5), then nine successes: 2.5, 2.9, 3.2, ... 4.8. Without the cut the
    # window would have grown from 4 to 5.9.
    assert (await throttle.status("dep:vision")).limit == 4


async def test_dynamic_limits_are_recomputed_from_the_members_traffic(
    transport: Transport, throttle: Throttle, unique: str
) -> None:
    """With dynamic limits on, the member reports its tenants' traffic and sets org limits."""
    spec = lane_spec(f"thrdyn_{unique}", 1, ordered=False, throttle={"keys": ["org:{tenant}"]})
    await declare(transport, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        pass

    fleet = FleetLimits(
        throttle.client,
        throttle.prefix,
        throttle,
        LimitPolicy(defaults=OrgLimits(floor=3, burst_floor=1)),
        member=throttle.member,
        interval_s=0.2,
    )
    producer = transport.producer()
    await producer.send_many(spec.name, [record("acme", n) for n in range(20)])
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST, throttle=throttle, fleet=fleet)
    async with running(member):
        await eventually(lambda: member.stats.handled == 20)
        await eventually(lambda: "acme" in fleet.last)
    # 20 quick jobs: base is the floor (3), ceiling 3 + max(1, ceil(3 * 0.5)) = 5, and the
    # factor is f_max (2) on an idle fleet.
    assert fleet.last["acme"] == 10
    assert (await throttle.status("org:acme")).limit == 10


async def test_a_run_still_going_when_its_partition_is_revoked_keeps_its_tenants_slot(
    transport: Transport, throttle: Throttle, unique: str
) -> None:
    """Revoked mid-run, the run keeps holding its slot until it ends, then gives it back.

    Before, revoking the partition released the slots of every admitted message of it, running
    or not: the tenant's next message (often the same one, at its partition's new owner) was
    admitted beside the run still going, past the tenant's limit.
    """
    spec = lane_spec(f"thrrev_{unique}", 1, throttle={"keys": ["org:{tenant}"]})
    await declare(transport, spec)
    app = App([spec])
    started, finish = asyncio.Event(), asyncio.Event()

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        started.set()
        await finish.wait()

    await throttle.set_limit("org:acme", 1)
    await produce(transport, spec.name, [record("acme", 0)])
    member, _ = metered(app, transport, unique, throttle)
    async with running(member):
        await asyncio.wait_for(started.wait(), 30)
        assert len((await throttle.status("org:acme")).holders) == 1
        await member.on_revoked([TopicPartition(spec.name, 0)], lost=True)  # moved away
        gate = member._chain.gate
        assert gate is not None
        await gate.released()  # what the revocation released has reached Redis
        assert len((await throttle.status("org:acme")).holders) == 1  # the run still holds it
        finish.set()
        await eventually(lambda: member.stats.handled == 1)
        for _ in range(500):  # the release goes to Redis in the background
            if not (await throttle.status("org:acme")).holders:
                break
            await asyncio.sleep(0.02)
        assert (await throttle.status("org:acme")).holders == ()


async def test_a_retry_after_given_as_header_text_does_not_wedge_the_lane(
    transport: Transport, throttle: Throttle, unique: str
) -> None:
    """A ``Throttled`` given a Retry-After header's text still settles and frees its slots."""
    spec = vision_lane(f"thrtxt_{unique}", max_attempts=5)
    await declare(transport, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        if event.offset == 0 and ctx.attempt == 1:
            raise Throttled(retry_after_s="1", dependency="vision")  # type: ignore[arg-type]

    await throttle.set_limit("org:acme", 1)
    await produce(transport, spec.name, [record("acme", n) for n in range(4)])
    member, _ = metered(app, transport, unique, throttle)
    tp = TopicPartition(spec.name, 0)
    async with running(member):
        await eventually(lambda: member.stats.handled == 4, timeout_s=20)
        await eventually(lambda: member._committed.get(tp) == Position(tp, 4), timeout_s=20)
