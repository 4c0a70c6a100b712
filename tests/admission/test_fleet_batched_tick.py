"""The fleet tick's per-org stats written and read a batch of orgs a call, on a real Redis.

Through pipelines each org cost five commands a tick (its stats written, read back), and
redis-py's packing and parsing of each made a tick of 50,000 orgs longer than its 10 s interval.
One ``lim_record`` and one ``lim_read`` call per batch must leave the same stats, with the same
expiry, and set the same limits as the pipelined commands did before batching: the reference is
that code, frozen here (:class:`PreBatchingTracker`), not the Redis Cluster path that ships
beside the Lua and could drift with it. Members of both kinds write the same keys during a
rolling deploy. Work is counted in commands sent, never timed.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence

import pytest
from redis.asyncio import Redis

from pipeline.admission import keys as k
from pipeline.admission.fleet import FleetLimits
from pipeline.admission.limit_functions import LimitFunctions
from pipeline.admission.limits import (
    ORGS_A_CALL,
    LimitPolicy,
    LimitTracker,
    OrgLimits,
    store_org_override,
)
from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis

POLICY = LimitPolicy(defaults=OrgLimits(floor=2, burst_floor=2, burst_pct=0.5), f_min=0.25)
ORGS = 2 * ORGS_A_CALL + 37  # three batches, the last one partial
DURATIONS = (0.1, 0.2, 1 / 3, 2.5, 7.0, 0.0, 13.37, 1e-9, 86_399.999_999)  # inexact sums
TTL_MS = 6 * 60_000  # the stats window and the current minute


def _name(i: int) -> str:
    """Org ``i``'s id: most plain, some with colons, braces, non-ASCII or 2,000 characters."""
    odd = (f"acme:{i}:eu", f"{{t{i}}}", f"}}{{x{i}", f"ünïcødé-☃-{i}", f"long-{i}-" + "x" * 2000)
    return odd[i % 10] if i % 10 < len(odd) and i >= 10 else f"org-{i}"


NAMES = [_name(i) for i in range(ORGS)]


class PreBatchingTracker(LimitTracker):
    """The per-org writes and reads as they were before batching (cf6a16a^), kept verbatim."""

    async def record_many(
        self, counts: Mapping[str, tuple[int, Sequence[float]]], *, now_s: float | None = None
    ) -> None:
        """Up to five pipelined commands an org, a thousand orgs a pipeline."""
        minute = int((time.time() if now_s is None else now_s) // 60)
        stale = range(minute - self._window_min - 10, minute - self._window_min)
        gone = [f"{kind}:{m}" for m in stale for kind in "ncd"]
        items = list(counts.items())
        for start in range(0, len(items), 1000):
            async with self._client.pipeline(transaction=False) as pipe:
                for org, (submitted, done) in items[start : start + 1000]:
                    key = k.limit_stats(self._prefix, org)
                    if submitted:
                        pipe.hincrby(key, f"n:{minute}", submitted)
                    if done:
                        pipe.hincrby(key, f"c:{minute}", len(done))
                        pipe.hincrbyfloat(key, f"d:{minute}", sum(done))
                    pipe.hdel(key, *gone)
                    pipe.pexpire(key, (self._window_min + 1) * 60_000)
                await pipe.execute()

    async def rates_many(
        self, orgs: Iterable[str], *, now_s: float | None = None
    ) -> dict[str, tuple[float, float]]:
        """One pipelined ``HGETALL`` an org, a thousand orgs a pipeline."""
        now_s = time.time() if now_s is None else now_s
        wanted = list(dict.fromkeys(orgs))
        out: dict[str, tuple[float, float]] = {}
        for start in range(0, len(wanted), 1000):
            chunk = wanted[start : start + 1000]
            async with self._client.pipeline(transaction=False) as pipe:
                for org in chunk:
                    pipe.hgetall(k.limit_stats(self._prefix, org))
                replies = await pipe.execute()
            for org, raw in zip(chunk, replies, strict=True):
                out[org] = self._rates_of(raw, now_s)
        return out


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


def _fleet(throttle: Throttle, load: Callable[[], tuple[int, int]]) -> FleetLimits:
    fleet = FleetLimits(throttle.client, throttle.prefix, throttle, POLICY, member="m")
    fleet.bind(load)
    return fleet


def _pre_batching(fleet: FleetLimits) -> FleetLimits:
    """``fleet`` writing and reading its stats as a member of the release before batching."""
    fleet._tracker = PreBatchingTracker(fleet._client, fleet._prefix)
    return fleet


def _traffic(rng: random.Random, tick: int) -> dict[str, tuple[int, list[float]]]:
    """One tick's counts: busy orgs every tick, others now and then, new ones later on."""
    counts: dict[str, tuple[int, list[float]]] = {}
    for i, org in enumerate(NAMES):
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
        lost = NAMES[::7]
        for throttle in pair:
            await client.delete(*(k.limit_stats(throttle.prefix, k.org_name(org)) for org in lost))
    if tick == 8:  # the library lost (FUNCTION FLUSH, a restart without persistence)
        await client.function_delete(f"pipeline_limits_{LimitFunctions(client).version}")


async def _state(client: Redis, prefix: str) -> tuple[object, ...]:
    """Every org's stats, when each org was last seen, and the limits set on the throttle."""
    stats = {org: await client.hgetall(k.limit_stats(prefix, k.org_name(org))) for org in NAMES}
    seen = await client.zrange(k.orgs_seen(prefix), 0, -1, withscores=True)
    return stats, seen, await client.hgetall(k.limits(prefix, "n"))


async def _server_ms(client: Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def _assert_expiry(client: Redis, prefix: str, orgs: Iterable[str], lo: int, hi: int) -> None:
    """Each of ``orgs``' stats expires ``TTL_MS`` after a write between ``lo`` and ``hi`` (ms).

    An org's stats go by its :func:`~pipeline.admission.keys.org_name` (a 2,000-character id by
    its head and digest, as its throttle key), the name the fleet counts it by.
    """
    for org in orgs:
        at = await client.pexpiretime(k.limit_stats(prefix, k.org_name(org)))
        assert lo + TTL_MS <= at <= hi + TTL_MS, org


async def test_the_batched_tick_sets_the_same_limits_and_stats_as_the_pipelined_one(
    pair: tuple[Throttle, Throttle],
) -> None:
    """A mix of orgs over ten ticks across seven minutes: same stats, same limits, every tick.

    Busy orgs, orgs seen now and then (idle in between), new ones, a flood while the fleet runs
    four times its target (every share shrinks), an override, stats lost for some orgs and the
    library itself lost from Redis between ticks; stale minutes are deleted on the way. Org ids
    hold colons, braces, non-ASCII and 2,000 characters; every key written expires as before.
    """
    client = pair[0].client
    load = [(10, 100)]
    batched = _fleet(pair[0], lambda: load[0])
    before = _pre_batching(_fleet(pair[1], lambda: load[0]))
    for throttle in pair:
        await store_org_override(client, throttle.prefix, NAMES[13], OrgLimits(dedicated=5))
    rng = random.Random(7)
    for tick in range(10):
        counts = _traffic(rng, tick)
        _feed((batched, before), counts)
        await _upset(tick, pair, load)
        at = 1_000_000.0 + tick * 47.0  # ticks on different seconds of different minutes
        started = await _server_ms(client)
        expected = await before.tick(at)
        got = await batched.tick(at)
        ended = await _server_ms(client)
        assert expected is not None
        assert got is not None
        assert got == expected, f"tick {tick}"
        assert await _state(client, pair[0].prefix) == await _state(client, pair[1].prefix)
        written = [org for org, (submitted, done) in counts.items() if submitted or done]
        for throttle in pair:
            await _assert_expiry(client, throttle.prefix, written, started, ended)
    assert 2 * ORGS_A_CALL < len(got) < ORGS  # over three batches; orgs gone quiet dropped
    assert len(set(got.values())) >= 5  # floors, earned bases, the override's dedicated 5


async def test_a_tick_over_several_batches_sends_a_few_commands_a_batch_and_covers_every_org(
    pair: tuple[Throttle, Throttle], commands: list[int]
) -> None:
    """2,000 orgs, sixteen batches: a few dozen commands a tick where five per org went out.

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


async def test_members_before_and_after_batching_share_the_stats_during_a_rolling_deploy(
    pair: tuple[Throttle, Throttle],
) -> None:
    """A member of each release counting the same orgs add up as two members of the old one.

    The stats keys, their fields and the numbers in them are the same either way: what one
    release wrote, the other adds to, deletes as stale and reads.
    """
    client = pair[0].client
    mixed, old = pair[0].prefix, pair[1].prefix
    rng = random.Random(11)
    writers = {
        mixed: (LimitTracker(client, mixed), PreBatchingTracker(client, mixed)),
        old: (PreBatchingTracker(client, old), PreBatchingTracker(client, old)),
    }
    for minute in range(12):  # past the window: stale minutes are deleted by either release
        at = 1_000_000.0 + minute * 60.0
        for member in range(2):
            counts = _traffic(rng, minute)
            for prefix in (mixed, old):
                await writers[prefix][member].record_many(counts, now_s=at)
        assert await _state(client, mixed) == await _state(client, old), f"minute {minute}"
        for reader in (*writers[mixed], *writers[old]):
            assert await reader.rates_many(NAMES, now_s=at) == await writers[old][0].rates_many(
                NAMES, now_s=at
            )
