"""Sizing the small tenants' reserve, and lending it to lower priorities.

The sizing is pure arithmetic, checked against hand-computed values; the lending is trunk
reservation in the throttle, checked on a real Redis.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import random
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from runtime.helpers import eventually

from pipeline.admission import keys
from pipeline.admission.reserve import (
    ReserveSizer,
    erlang_c,
    headroom_slots,
    least_idle_slots,
    lendable,
    lendable_share,
    plan,
    reserve_slots,
    wait_probability,
)
from pipeline.admission.throttle import Throttle

HIGH, LOW = 10, 0

# -- the arithmetic ------------------------------------------------------------------------------


def test_erlang_c_matches_hand_computed_values():
    """C(1, 0.5) = 0.5 (M/M/1); C(2, 1) = 1/3; C(3, 2) = 4/9; C(10, 4) by hand: 0.00881."""
    assert erlang_c(1, 0.5) == pytest.approx(0.5)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(3, 2.0) == pytest.approx(4 / 9)
    # A = 4, c = 10: A^10/10! = 0.288959, x 10/6 = 0.481599; sum_{k<10} 4^k/k! = 54.154145
    assert erlang_c(10, 4.0) == pytest.approx(0.481599 / (54.154145 + 0.481599), rel=1e-4)


def test_erlang_c_edges():
    """No load never waits; a load the servers cannot carry always does."""
    assert erlang_c(4, 0.0) == 0.0
    assert erlang_c(4, 4.0) == 1.0
    assert erlang_c(0, 1.0) == 1.0


def test_reserve_is_the_least_servers_under_the_target():
    """4 Erlangs (70.5 jobs/s of 56.7 ms) need 10 slots for P(wait) < 1 %; 9 give 2.4 %."""
    assert erlang_c(9, 4.0) == pytest.approx(0.02376, abs=1e-4)
    assert reserve_slots(70.5, 4.0 / 70.5) == 10
    assert reserve_slots(0.0, 0.05) == 0
    assert reserve_slots(1.0, 0.5, target=0.5) == 2  # C(1, 0.5) = 0.5 is not below 0.5


def test_headroom_from_the_birth_death_chain():
    """With f of the slots free a slot comes back at (slots - f) / D; a full pool queues.

    4 slots, λ·D = 1, u = 1/4: h = 1 gives π = (1/4, 1), the full pool 1/4 / (1 - u) = 1/3 and
    P = (1/3) / (1 + 1/3) = 1/4; h = 2 gives π = (1/12, 1/3, 1), full 1/9, P = 1/13.
    """
    assert wait_probability(1, 1.0, 4, 1.0) == pytest.approx(1 / 4)
    assert wait_probability(2, 1.0, 4, 1.0) == pytest.approx(1 / 13)
    assert wait_probability(0, 1.0, 4, 1.0) == 1.0  # nothing kept: every small job waits
    assert headroom_slots(1.0, 4, 1.0, target=0.1) == 2
    assert headroom_slots(1.0, 4, 1.0, target=0.3) == 1
    assert wait_probability(3, 0.0, 4, 1.0) == 0.0  # nothing arrives
    assert wait_probability(3, 1.0, 4, 0.0) == 1.0  # nothing is known to come back
    assert wait_probability(3, 5.0, 4, 1.0) == 1.0  # the small tenants alone overload it
    assert headroom_slots(50.0, 6, 1.0) == 6  # cannot keep up: everything is kept
    # The benchmark's pool: 16 slots, λ·D = 4, u = 1/4; h = 3: π(2..0) = 4/14, x 4/15, x 4/16.
    pi = [4 / 14 * 4 / 15 * 4 / 16, 4 / 14 * 4 / 15, 4 / 14, 1.0]
    full = pi[0] / (1 - 1 / 4)
    assert wait_probability(3, 4.0, 16, 1.0) == pytest.approx(full / (sum(pi[1:]) + full))
    assert headroom_slots(4.0, 16, 1.0) == 4  # 1.83 % with 3, 0.55 % with 4


def test_no_lending_policy_keeps_fewer_slots_idle_than_the_cut_bound():
    """π(f) ≤ π(f - 1)·(slots - f + 1)/(λ·D), from P(wait)·(1 - u): the least mean idle.

    16 slots, λ·D = 4 (u = 1/4), 1 %: caps 0.03, 0.1125 and 0.39375 on 1, 2 and 3 free slots,
    the remaining 0.45375 on 4: a mean of 3.25125, so a flooder fills at most 1 - 3.25125/12 of
    the 12 slots left.
    """
    mean = 0.03 + 2 * 0.1125 + 3 * 0.39375 + 4 * 0.45375
    assert least_idle_slots(4.0, 16, 1.0) == pytest.approx(mean)
    assert lendable_share(4.0, 16, 1.0) == pytest.approx(1 - mean / 12)
    assert lendable_share(4.0, 16, 1.0, target=0.15) < 0.9 < lendable_share(4.0, 16, 1.0, 0.17)
    assert least_idle_slots(0.0, 16, 1.0) == 0.0  # nothing arrives: nothing need stay idle
    # 2 slots at 1 Erlang cannot hold P(wait) to 10 % even with both kept (Erlang C: 1/3).
    assert least_idle_slots(1.0, 2, 1.0, target=0.1) == 2.0
    assert least_idle_slots(3.0, 2, 1.0) == 2.0  # the small tenants alone overload it
    assert lendable_share(1.0, 2, 1.0, target=0.1) == 0.0
    assert lendable_share(20.0, 16, 1.0) == 0.0  # the small tenants leave no room


@pytest.mark.parametrize("headroom", [1, 2, 3, 4, 6])
def test_the_headroom_chain_meets_the_bound_exactly(headroom):
    """Trunk reservation at h is the policy the bound describes: same P(wait), same mean idle.

    The mean counts the full pool's queue as no idle slot: π(0) / (1 - u) at zero.
    """
    offered, slots = 4.0, 16
    pi = [1.0]  # π(h), π(h - 1), ..., π(0), unnormalised
    for free in range(headroom - 1, -1, -1):
        pi.append(pi[-1] * offered / (slots - free))
    total = sum(pi[:-1]) + pi[-1] / (1 - offered / slots)
    mean_idle = sum((headroom - i) * p for i, p in enumerate(pi)) / total
    p_wait = wait_probability(headroom, offered, slots, 1.0)
    assert least_idle_slots(offered, slots, 1.0, target=p_wait) == pytest.approx(mean_idle)


def simulated_wait(headroom: int, *, lognormal: bool, seconds: float = 1500.0) -> float:
    """The share of small jobs that queue in a simulated pool: 16 slots, trunk reservation.

    Small jobs arrive as a Poisson stream (70.5/s) and take any free slot, else queue and take
    the next release; a flooder, always backlogged, refills the pool to ``16 - headroom``
    whenever a release leaves no small job queued. Holds are exponential or lognormal (median
    50 ms, sigma 0.5: the fairness benchmark's handlers), mean 56.7 ms either way.
    """
    rng = random.Random(7)
    mu, sigma = math.log(0.05), 0.5
    mean = math.exp(mu + sigma * sigma / 2)

    def hold() -> float:
        return rng.lognormvariate(mu, sigma) if lognormal else rng.expovariate(1 / mean)

    releases = [hold() for _ in range(16 - headroom)]
    heapq.heapify(releases)
    busy, queued, arrivals, waited = 16 - headroom, 0, 0, 0
    arrival = rng.expovariate(70.5)
    while arrival < seconds:
        if releases[0] < arrival:
            now = heapq.heappop(releases)
            if queued:
                queued -= 1
                heapq.heappush(releases, now + hold())
                continue
            busy -= 1
            while busy < 16 - headroom:
                busy += 1
                heapq.heappush(releases, now + hold())
            continue
        arrivals += 1
        if busy < 16:
            busy += 1
            heapq.heappush(releases, arrival + hold())
        else:
            waited += 1
            queued += 1
        arrival += rng.expovariate(70.5)
    return waited / arrivals


@pytest.mark.parametrize("headroom", [3, 4])
def test_the_chain_matches_a_simulated_pool(headroom):
    """P(wait) by the chain, with the full pool's queue, against a simulation of the pool.

    Exponential holds are the chain's own assumption; the benchmark's lognormal holds come out
    within the same tolerance. Without the queue the chain said 1.37 % and 0.41 %.
    """
    mean = math.exp(math.log(0.05) + 0.125)
    expected = wait_probability(headroom, 70.5, 16, mean)  # 1.83 %, 0.55 %
    for lognormal in (False, True):
        assert simulated_wait(headroom, lognormal=lognormal) == pytest.approx(expected, rel=0.2)


def test_lendable_keeps_the_headroom():
    """The flooder borrows the unused reserve less the headroom, never below zero."""
    assert lendable(10, 4, 3) == 3
    assert lendable(10, 9, 3) == 0


def test_plan_for_the_benchmark_pool():
    """16 slots, 70.5 small jobs/s of 56.7 ms: reserve 10 by Erlang C, headroom 4 of it."""
    mean_s = math.exp(math.log(0.05) + 0.125)
    sized = plan(16, 70.5, mean_s, mean_s)
    assert sized.reserve == 10
    assert sized.headroom == 4  # P(wait) 1.82 % with 3, 0.54 % with 4
    assert sized.wait_probability == pytest.approx(0.0054, abs=1e-4)
    assert sized.offered == pytest.approx(70.5 * mean_s)


# -- lending on a real Redis ---------------------------------------------------------------------


@pytest.fixture
async def throttle(redis_service: str, unique: str) -> AsyncIterator[Throttle]:
    """A started throttle on a namespace of its own, default limit 4; its keys go afterwards."""
    client = Redis.from_url(redis_service)
    thr = Throttle(client, namespace=f"r{unique}", default_limit=4)
    await thr.start()
    yield thr
    await thr.close()
    async for key in client.scan_iter(match=f"{keys.tag(thr.prefix, thr.namespace)}*"):
        await client.delete(key)
    await client.aclose()


async def test_lower_priority_borrows_all_but_the_headroom(throttle):
    """With 2 of 4 slots kept free for HIGH, LOW may fill the pool only up to 2 holders."""
    await throttle.set_reserve("pool", 2, HIGH)
    low = [await throttle.acquire(["pool"], priority=LOW) for _ in range(2)]
    waiting = asyncio.create_task(throttle.acquire(["pool"], priority=LOW))
    await eventually(lambda: throttle.waited == 1)
    high = [await throttle.acquire(["pool"], priority=HIGH) for _ in range(2)]  # no wait
    assert throttle.waited == 1
    await throttle.release(high[0])
    await throttle.release(low[0])
    assert not waiting.done()  # 2 holders (one LOW, one HIGH): the headroom stays free
    await throttle.release(high[1])
    third = await asyncio.wait_for(waiting, 10)  # 1 holder: LOW borrows again
    status = await throttle.status("pool")
    assert len(status.holders) == 2
    for permit in (low[1], third):
        await throttle.release(permit)


async def test_high_priority_passes_low_waiters_into_the_reserve(throttle):
    """A HIGH newcomer takes a reserved slot even while LOW permits queue for the pool."""
    await throttle.set_reserve("pool", 1, HIGH)
    low = [await throttle.acquire(["pool"], priority=LOW) for _ in range(3)]
    waiting = asyncio.create_task(throttle.acquire(["pool"], priority=LOW))
    await eventually(lambda: throttle.waited == 1)
    high = await asyncio.wait_for(throttle.acquire(["pool"], priority=HIGH), 10)
    assert throttle.waited == 1  # HIGH did not queue behind LOW
    assert not waiting.done()
    await throttle.release(high)
    await throttle.release(low[0])  # 2 holders: below LOW's room of 3
    await asyncio.wait_for(waiting, 10)
    for permit in (*low[1:], waiting.result()):
        await throttle.release(permit)


async def test_the_reserve_counts_its_priorities_asking_and_queueing(throttle):
    """Permits of the reserve's priorities that reach the key are counted, and those that queue.

    Lower priorities and keys without a reserve count nothing; a queued permit granted later
    is not counted again: the two counts give the reserve's measured P(wait).
    """
    await throttle.set_reserve("pool", 1, HIGH)
    low = [await throttle.acquire(["pool"], priority=LOW) for _ in range(3)]
    first = await throttle.acquire(["org:a", "pool"], priority=HIGH)  # the last free slot
    waiting = asyncio.create_task(throttle.acquire(["pool"], priority=HIGH))
    await eventually(lambda: throttle.waited == 1)
    low_waiting = asyncio.create_task(throttle.acquire(["pool"], priority=LOW))
    await eventually(lambda: throttle.waited == 2)
    status = await throttle.status("pool")
    assert (status.reserve, status.reserved_asked, status.reserved_queued) == ((1, HIGH), 2, 1)
    assert status.as_dict()["reserve"] == {
        "slots": 1,
        "min_priority": HIGH,
        "asked": 2,
        "queued": 1,
    }
    assert (await throttle.status("org:a")).reserved_asked == 0  # no reserve on it
    await throttle.release(first)
    second = await asyncio.wait_for(waiting, 10)
    status = await throttle.status("pool")
    assert (status.reserved_asked, status.reserved_queued) == (2, 1)
    for permit in (*low, second):
        await throttle.release(permit)
    await throttle.release(await asyncio.wait_for(low_waiting, 10))
    assert (await throttle.status("pool")).reserved_asked == 2


async def test_resizing_the_reserve_hands_freed_room_to_waiters(throttle):
    """Shrinking the headroom lends more at once: the waiting LOW permit is granted."""
    sizer = ReserveSizer(throttle, "pool", slots=4, min_priority=HIGH)
    busy = await sizer.resize(arrival_per_s=40.0, service_s=0.05, pool_service_s=0.05)
    assert busy.headroom >= 2  # r = 40 / 80 = 0.5: h with P(wait) < 1 % is capped by reserve
    held = [await throttle.acquire(["pool"], priority=LOW) for _ in range(4 - busy.headroom)]
    waiting = asyncio.create_task(throttle.acquire(["pool"], priority=LOW))
    await eventually(lambda: throttle.waited == 1)
    quiet = await sizer.resize(arrival_per_s=0.5, service_s=0.05, pool_service_s=0.05)
    assert quiet.headroom < busy.headroom
    granted = await asyncio.wait_for(waiting, 10)
    for permit in (*held, granted):
        await throttle.release(permit)
