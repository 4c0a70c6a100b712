"""The fleet tick's per-org stats written and read a batch of orgs a call, on a real Redis.

Through pipelines each org cost five commands a tick (its stats written, read back), and
redis-py's packing and parsing of each made a tick of 50,000 orgs longer than its 10 s interval.
One ``lim_record`` and one ``lim_read`` call per batch must leave the same stats and set the
same limits as the pipelined commands, which a Redis Cluster still uses. Work is counted in
commands sent, never timed.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

from pipeline.admission import keys as k
from pipeline.admission.fleet import FleetLimits
from pipeline.admission.limit_functions import LimitFunctions
from pipeline.admission.limits import ORGS_A_CALL, LimitPolicy, OrgLimits, store_org_override
from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis

POLICY = LimitPolicy(defaults=OrgLimits(floor=2, burst_floor=2, burst_pct=0.5), f_min=0.25)
ORGS = 2 * ORGS_A_CALL + 37  # three batches, the last one partial
DURATIONS = (0.1, 0.2, 1 / 3, 2.5, 7.0, 0.0, 13.37)  # sums that are no exact binary fractions


@pytest.fixture
async def pair(redis_service: str, unique: str) -> AsyncIterator[tuple[Throttle, Throttle]]:
    """Two started throttles on one Redis, under prefixes of their own."""
    client = Redis.from_url(redis_service)
    a = Throttle(client, prefix=f"b{unique}", namespace="n")
    b = Throttle(client, prefix=f"p{unique}", namespace="n")
    for t in (a, b):
        await t.start()
    yield a, b
    for t in (a, b):
        await t.close()
    await client.aclose()


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the commands redis-py sends, each command of a pipeline on its own."""
    count = [0]
    pack = AbstractConnection.pack_command

    def counted(self: AbstractConnection, *args: object) -> list[bytes]:
        count[0] += 1
        return pack(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(AbstractConnection, "pack_command", counted)
    return count


def _fleet(throttle: Throttle, load: Callable[[], tuple[int, int]]) -> FleetLimits:
    fleet = FleetLimits(throttle.client, throttle.prefix, throttle, POLICY, member="m")
    fleet.bind(load)
    return fleet


def _pipelined(fleet: FleetLimits) -> FleetLimits:
    """``fleet`` writing and reading its stats through pipelines, as on a Redis Cluster."""
    fleet._tracker._functions = None  # the path a Redis Cluster takes
    return fleet


def _traffic(rng: random.Random, tick: int) -> dict[str, tuple[int, list[float]]]:
    """One tick's counts: busy orgs every tick, others now and then, new ones later on."""
    counts: dict[str, tuple[int, list[float]]] = {}
    for i in range(ORGS):
        org = f"org-{i}"
        if i < 40:  # busy: many jobs of varied durations each tick
            counts[org] = (rng.randint(50, 400), rng.choices(DURATIONS, k=rng.randint(20, 200)))
        elif i < ORGS - 100 and rng.random() < 0.3:  # now and then, one or a few jobs
            done = rng.choices(DURATIONS, k=rng.randint(0, 3))
            counts[org] = (rng.randint(0, 3), done)
        elif i >= ORGS - 100 and tick >= 4 and rng.random() < 0.5:  # new from tick 4 on
            counts[org] = (1, [])
    return counts


def _feed(fleets: tuple[FleetLimits, ...], counts: dict[str, tuple[int, list[float]]]) -> None:
    for org, (submitted, done) in counts.items():
        for fleet in fleets:
            for _ in range(submitted):
                fleet.submitted(org)
            for seconds in done:
                fleet.finished(org, seconds)


async def _upset(tick: int, pair: tuple[Throttle, Throttle], load: list[tuple[int, int]]) -> None:
    """What happens to the fleet before some ticks, to both sides alike."""
    client = pair[0].client
    if tick == 5:  # a flood: the fleet runs four times its target, every share shrinks
        load[0] = (320, 100)
    if tick == 7:  # stats lost for some orgs (evicted, a failover without persistence)
        lost = [f"org-{i}" for i in range(0, ORGS, 7)]
        for throttle in pair:
            await client.delete(*(k.limit_stats(throttle.prefix, org) for org in lost))
    if tick == 8:  # the library lost (FUNCTION FLUSH, a restart without persistence)
        await client.function_delete(f"pipeline_limits_{LimitFunctions(client).version}")


async def _state(client: Redis, prefix: str) -> tuple[dict[str, dict[bytes, bytes]], object]:
    """Every org's stats, and the limits set on the throttle."""
    stats = {
        f"org-{i}": await client.hgetall(k.limit_stats(prefix, f"org-{i}")) for i in range(ORGS)
    }
    return stats, await client.hgetall(k.limits(prefix, "n"))


async def test_the_batched_tick_sets_the_same_limits_and_stats_as_the_pipelined_one(
    pair: tuple[Throttle, Throttle],
) -> None:
    """A mix of orgs over ten ticks across seven minutes: same stats, same limits, every tick.

    Busy orgs, orgs seen now and then (idle in between), new ones, a flood while the fleet runs
    four times its target (every share shrinks), an override, stats lost for some orgs and the
    library itself lost from Redis between ticks; stale minutes are deleted on the way.
    """
    client = pair[0].client
    load = [(10, 100)]
    batched = _fleet(pair[0], lambda: load[0])
    pipelined = _pipelined(_fleet(pair[1], lambda: load[0]))
    for throttle in pair:
        await store_org_override(client, throttle.prefix, "org-3", OrgLimits(dedicated=5))
    rng = random.Random(7)
    for tick in range(10):
        _feed((batched, pipelined), _traffic(rng, tick))
        await _upset(tick, pair, load)
        at = 1_000_000.0 + tick * 47.0  # ticks on different seconds of different minutes
        expected = await pipelined.tick(at)
        got = await batched.tick(at)
        assert expected is not None
        assert got == expected, f"tick {tick}"
        assert await _state(client, pair[0].prefix) == await _state(client, pair[1].prefix)
    assert 2 * ORGS_A_CALL < len(got) < ORGS  # over three batches; orgs gone quiet dropped
    assert len(set(got.values())) >= 5  # floors, earned bases, the override's dedicated 5


async def test_a_tick_over_several_batches_sends_a_few_commands_a_batch_and_covers_every_org(
    pair: tuple[Throttle, Throttle], commands: list[int]
) -> None:
    """2,000 orgs, eight batches: a few dozen commands a tick where five per org went out.

    Each org's stats are written, read back and its limit set, the last batch's as the first's.
    """
    throttle = pair[0]
    fleet = _fleet(throttle, lambda: (1, 100))
    orgs = [f"tenant-{i}" for i in range(2_000)]
    for org in orgs:
        fleet.submitted(org)
        fleet.finished(org, 1.0)
    before = commands[0]
    limits = await fleet.tick(1_000_000.0)
    assert commands[0] - before <= 60  # some 12,000 through pipelines
    assert limits is not None
    assert sorted(limits) == sorted(orgs)
    assert set(limits.values()) == {8}  # base 2, ceiling 4, an idle fleet's factor 2
    client = throttle.client
    assert await client.hlen(k.limits(throttle.prefix, "n")) == len(orgs)
    async with client.pipeline(transaction=False) as pipe:
        for org in orgs:
            pipe.hgetall(k.limit_stats(throttle.prefix, org))
        stats = await pipe.execute()
    assert stats == [{b"n:16666": b"1", b"c:16666": b"1", b"d:16666": b"1"}] * len(orgs)
