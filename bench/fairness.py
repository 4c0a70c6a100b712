"""The noisy neighbour: 50 steady tenants and one flooder on a fixed pool of worker slots.

Four phases in one run, each ``--phase-s`` seconds (``make bench-fairness``):

1. **calm**: the 50 small tenants alone, through the throttle (their no-flood wait);
2. **fifo**: the small tenants plus a flooder submitting at ``--flood-x`` times the pool's
   capacity, all through one shared FIFO queue and ``--slots`` workers (no admission);
3. **throttle**: the same load through :class:`~pipeline.admission.throttle.Throttle`;
4. **subtenants**: the flood split across ``--subs`` sub-tenant keys of the flooder's org.

Then the **multi-member** variant: phases 1 and 3 again, the load split over three member
processes that share the throttle (each its own ``Throttle`` member, woken through its wake
list when another member's release hands it a slot).

A job's *wait* is from its submission to its handler's start; handlers sleep a lognormal time
(median ``--median-ms``, sigma 0.5). With the throttle, every job takes its keys (``sub:FLOODER/N``,
``org:TENANT``, ``pool``) in one call; ``pool`` has the limit ``--slots``, so waiting work holds no
worker. A tenant below its floor of in-flight work asks with priority 10, one within its earned
ceiling with 5, others with 0 (the batch-lane style gate): a small tenant just over its floor queues
ahead of the flood, not behind it. The slots kept for priorities 5 and up (every small tenant's
job; the flooder, beyond its ceiling, only borrows them) are sized by
``pipeline.admission.reserve`` from the measured rates: the reserve the small tenants would need to
themselves for P(wait) < 1 % (Erlang C), of which everything but a headroom is lent to lower
priorities while unused (trunk reservation on ``pool``, ``Throttle.set_reserve``); the headroom is
the least number of idle slots for which a small job finds none free in under 1 % of arrivals, given
how fast lent slots come back. Each second the sizer re-sizes it from the small arrivals and the
slots' hold times (grant to release) measured over the last five seconds (the multi-member variant
from what every member reports each second). The flooder keeps at most ``2 * slots`` acquisitions
outstanding (``--subs`` variant: 2 per sub-tenant); the rest of its flood waits in its backlog, as
the runtime defers over-limit messages instead of holding them.

Figures (last line, one JSON object): ``isolation_p99`` small tenants' p99 wait under the flood /
without it; ``vs_fifo_p99`` FIFO's small p99 / the throttle's; ``jain`` Jain's index of the
sub-tenants' throughput in phase 4 (all backlogged); ``stranded_slot_s`` idle slot-seconds while a
waiting job's keys all had room for it, the reserve counted (sampled every 5 ms);
``over_admissions`` times a key had more running jobs than its limit; ``flooder_share`` flooder
throughput / (capacity - small throughput); ``flooder_share_bound`` the most of it any
non-preemptive pool can give the flooder while a small job waits for a slot in under 1 % of
arrivals (``reserve.lendable_share`` at the nominal rates); ``roundtrips_per_admission``;
``wake_p99_ms`` hand-over in Redis to the waiter's wake read; ``admissions_per_s`` in phase 3;
``reserve`` and ``headroom`` as last sized; ``p_wait`` the share of small jobs that queued on
the pool in the org-flood phase, as the throttle counted them in Redis
(``ThrottleStatus.reserved_queued / reserved_asked``), beside ``p_wait_planned``, the last
plan's; ``multi_member_isolation_p99`` (the small tenants' p99 wait under the flood / calm,
three members), ``multi_member_wake_p99_ms`` (hand-over in Redis to the woken member's read),
``multi_member_reserve`` and ``multi_member_headroom`` (as the fleet's sizer last sized them),
``multi_member_p_wait`` and ``multi_member_p_wait_planned``.

Each phase also records every started job's tenant class (small or flooder), submission and start
time; from these, after the last phase, ``docs/fairness.csv`` (per phase, class and 1-second
window of start time: jobs started and their p99 wait) and ``docs/fairness.png`` (the same p99
waits over time, if matplotlib is installed). A flooder job's wait in phases 3 and 4 starts when
it enters the throttle, not when it joined the flooder's backlog.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import multiprocessing as mp
import queue
import random
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from common import percentile
from redis.asyncio import Redis

from pipeline.admission import keys
from pipeline.admission.limits import ceiling, earned_base
from pipeline.admission.reserve import ReserveSizer, lendable_share
from pipeline.admission.throttle import Throttle
from pipeline.config import load_settings

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
SMALL = [f"s{i:02d}" for i in range(50)]
FLOODER = "flood"
HIGH, MID, LOW = 10, 5, 0
RESERVED = MID
"""The least priority the pool's reserve serves: every small tenant's job, under its floor or
within its earned ceiling, since the reserve is sized from all of their arrivals; the flooder,
beyond its ceiling (priority 0), only borrows it."""
MEMBERS = 3
RATE_WINDOW_S = 5.0


@dataclass
class Phase:
    """What one phase measured."""

    name: str
    waits_s: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    done: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    busy_s: float = 0.0
    stranded_slot_s: float = 0.0
    over_admissions: int = 0
    admissions: int = 0
    roundtrips: int = 0
    span_s: float = 0.0
    started_at: float = 0.0  # time.monotonic() when its load began
    wake_delays_ms: list[float] = field(default_factory=list)
    reserve: int = 0
    headroom: int = 0
    p_wait_planned: float = 0.0  # the last plan's P(wait) of a small job
    reserved_asked: int = 0  # small jobs that asked the pool (Redis' count, every member)
    reserved_queued: int = 0  # those of them that queued on it
    # Per started job: (tenant class, submitted, started), seconds since ``started_at``.
    jobs: list[tuple[str, float, float]] = field(default_factory=list)


def tenant_class(tenant: str) -> str:
    """``flooder`` or ``small``, the classes of the wait-over-time series."""
    return "flooder" if tenant == FLOODER else "small"


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one gets everything."""
    total, squares = sum(values), sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0


class Load:
    """Arrivals and service times shared by all phases."""

    def __init__(self, args: argparse.Namespace, *, share: float = 1.0, seed: int = 0) -> None:
        """The load, or ``share`` of its small arrivals (one member of several)."""
        self.args = args
        self.rng = random.Random(args.seed + seed)
        self.mu = math.log(args.median_ms / 1000)
        self.mean_s = math.exp(self.mu + 0.125)  # lognormal mean, sigma 0.5
        self.capacity_per_s = args.slots / self.mean_s
        self.small_rate_per_s = args.small_load * self.capacity_per_s
        self.share = share

    def service_s(self) -> float:
        return self.rng.lognormvariate(self.mu, 0.5)

    async def small_arrivals(
        self, submit: Callable[[str, str | None], None], stop: asyncio.Event
    ) -> None:
        # Arrivals keep to their own clock, so a late event loop does not thin the load out.
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not stop.is_set():
            next_at += self.rng.expovariate(self.small_rate_per_s * self.share)
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            submit(self.rng.choice(SMALL), None)


async def run_fifo(load: Load, phase_s: float) -> Phase:
    """Phase 2: one shared FIFO queue, ``slots`` workers, the flood enqueued as it comes."""
    phase, queue = Phase("fifo"), asyncio.Queue[tuple[str, float]]()
    stop = asyncio.Event()

    def submit(tenant: str, _sub: str | None) -> None:
        queue.put_nowait((tenant, time.monotonic()))

    async def worker() -> None:
        while not stop.is_set():
            tenant, t0 = await queue.get()
            started = time.monotonic()
            phase.waits_s[tenant].append(started - t0)
            at = phase.started_at
            phase.jobs.append((tenant_class(tenant), t0 - at, started - at))
            service = load.service_s()
            await asyncio.sleep(service)
            phase.busy_s += service
            phase.done[tenant] += 1

    async def flood() -> None:
        per_tick = load.args.flood_x * load.capacity_per_s / 100
        carry = 0.0
        while not stop.is_set():
            carry += per_tick
            for _ in range(int(carry)):
                submit(FLOODER, None)
            carry -= int(carry)
            await asyncio.sleep(0.01)

    phase.started_at = time.monotonic()
    tasks = [asyncio.create_task(worker()) for _ in range(load.args.slots)]
    tasks += [asyncio.create_task(load.small_arrivals(submit, stop)), asyncio.create_task(flood())]
    await asyncio.sleep(phase_s)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    phase.span_s = phase_s
    return phase


class ThrottledRun:
    """Phases 1, 3 and 4: every job acquires its keys from the throttle before it runs."""

    def __init__(
        self,
        load: Load,
        throttle: Throttle,
        name: str,
        *,
        flood: str,
        sized: bool = True,
        stats: Any = None,
        stats_index: int = 0,
    ) -> None:
        self.load, self.throttle, self.flood = load, throttle, flood
        self.sized = sized  # False: another process set the limits and the reserve
        self.stats = stats  # a member's queue of its rates for the fleet's sizer, or None
        self.stats_index = stats_index
        self.phase = Phase(name)
        self.sizer = ReserveSizer(throttle, "pool", load.args.slots, RESERVED)
        self.small_arrivals: list[float] = []  # monotonic submission times (small tenants)
        self.holds: list[tuple[float, float]] = []  # (released at, slot held s), every job
        self.limits: dict[str, int] = {}
        self.running: dict[str, int] = defaultdict(int)
        self.outstanding: dict[str, int] = defaultdict(int)  # per tenant: waiting + running
        self.waiting: dict[int, tuple[tuple[str, ...], int]] = {}  # keys, priority
        self.stop = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()

    async def set_limits(self) -> None:
        self.limits = limits_for(self.load)
        if not self.sized:
            return
        await asyncio.gather(*(self.throttle.set_limit(k, v) for k, v in self.limits.items()))
        await self.size_reserve(self.load.small_rate_per_s, self.load.mean_s, self.load.mean_s)

    async def size_reserve(self, rate_per_s: float, small_s: float, pool_s: float) -> None:
        """Size the pool's reserve (or keep ``--reserve`` slots, if given)."""
        if self.load.args.reserve >= 0:
            await self.throttle.set_reserve("pool", self.load.args.reserve, RESERVED)
            self.phase.headroom = self.phase.reserve = self.load.args.reserve
            return
        sized = await self.sizer.resize(rate_per_s, small_s, pool_s)
        self.phase.reserve, self.phase.headroom = sized.reserve, sized.headroom
        self.phase.p_wait_planned = sized.wait_probability

    async def resize_loop(self) -> None:
        """Each second, re-size the reserve from the rates measured over the last window."""
        while not self.stop.is_set():
            await asyncio.sleep(1.0)
            now = time.monotonic()
            span = min(RATE_WINDOW_S, now - self.phase.started_at)
            recent = [s for at, s in self.holds if at >= now - span]
            arrivals = sum(1 for at in self.small_arrivals if at >= now - span)
            if span > 0 and recent:
                mean = sum(recent) / len(recent)  # the slot's hold: the run and the release
                await self.size_reserve(arrivals / span, mean, mean)

    async def report_loop(self) -> None:
        """Each second, put this member's small arrivals and slot holds since the last report."""
        arrivals = holds = 0
        last = time.monotonic()
        while not self.stop.is_set():
            await asyncio.sleep(1.0)
            now, new_holds = time.monotonic(), self.holds[holds:]
            self.stats.put(
                Report(
                    self.stats_index,
                    time.time(),
                    now - last,
                    len(self.small_arrivals) - arrivals,
                    sum(s for _, s in new_holds),
                    len(new_holds),
                )
            )
            arrivals, holds, last = len(self.small_arrivals), holds + len(new_holds), now

    def keys_of(self, tenant: str, sub: str | None) -> list[str]:
        keys = [f"org:{tenant}", "pool"]
        return [*keys, f"sub:{tenant}/{sub}"] if sub is not None else keys

    def submit(self, tenant: str, sub: str | None) -> None:
        self.small_arrivals.append(time.monotonic())
        task = asyncio.create_task(self.job(tenant, sub))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def job(self, tenant: str, sub: str | None) -> None:
        keys = self.keys_of(tenant, sub)
        outstanding = self.outstanding[tenant]
        priority = HIGH if outstanding < self.load.args.floor else LOW
        if (
            priority == LOW
            and outstanding < self.limits.get(f"org:{tenant}", 0) < self.load.args.slots
        ):
            priority = MID  # within its earned ceiling (the flooder's org is the whole pool)
        self.outstanding[tenant] += 1
        ident = id(asyncio.current_task())
        self.waiting[ident] = (tuple(keys), priority)
        t0 = time.monotonic()
        try:
            permit = await self.throttle.acquire(keys, priority=priority)
        finally:
            self.waiting.pop(ident, None)
        started = time.monotonic()
        self.phase.waits_s[tenant].append(started - t0)
        at = self.phase.started_at
        self.phase.jobs.append((tenant_class(tenant), t0 - at, started - at))
        self.phase.admissions += 1
        for key in permit.keys:
            self.running[key] += 1
            if self.running[key] > self.limits.get(key, self.throttle.default_limit):
                self.phase.over_admissions += 1
        service = self.load.service_s()
        await asyncio.sleep(service)
        self.phase.busy_s += service
        for key in permit.keys:
            self.running[key] -= 1
        await self.throttle.release(permit)
        released = time.monotonic()
        self.holds.append((released, released - started))
        self.outstanding[tenant] -= 1
        self.phase.done[tenant if sub is None else f"{tenant}/{sub}"] += 1

    async def flood_pump(self) -> None:
        """Keep the flooder's outstanding acquisitions at the per-member bound."""
        args = self.load.args
        subs = [str(i) for i in range(args.subs)] if self.flood == "subs" else [None]
        bound = 2 if self.flood == "subs" else math.ceil(2 * args.slots * self.load.share)
        per_sub: dict[str | None, int] = defaultdict(int)

        async def one(sub: str | None) -> None:
            try:
                await self.job(FLOODER, sub)
            finally:
                per_sub[sub] -= 1
                refill.set()

        refill = asyncio.Event()
        while not self.stop.is_set():
            for sub in subs:
                while per_sub[sub] < bound:
                    per_sub[sub] += 1
                    task = asyncio.create_task(one(sub))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
            refill.clear()
            await refill.wait()

    def admissible(self, keys: tuple[str, ...], priority: int) -> bool:
        """Whether a waiter's keys all have room for it (the pool's reserve included)."""
        kept = self.phase.headroom if priority < RESERVED else 0
        return all(
            self.running[k] < self.limits.get(k, 0) - (kept if k == "pool" else 0) for k in keys
        )

    async def sample(self) -> None:
        slots, tick_s = self.load.args.slots, 0.005
        while not self.stop.is_set():
            await asyncio.sleep(tick_s)
            idle = slots - self.running["pool"]
            if idle > 0:
                ready = sum(1 for w in self.waiting.values() if self.admissible(*w))
                self.phase.stranded_slot_s += min(idle, ready) * tick_s

    async def run(self, phase_s: float) -> Phase:
        await self.set_limits()
        before = self.throttle.roundtrips
        self.phase.started_at = time.monotonic()
        background = [
            asyncio.create_task(self.load.small_arrivals(self.submit, self.stop)),
            asyncio.create_task(self.sample()),
        ]
        if self.sized:
            background.append(asyncio.create_task(self.resize_loop()))
        if self.stats is not None:
            background.append(asyncio.create_task(self.report_loop()))
        if self.flood != "none":
            background.append(asyncio.create_task(self.flood_pump()))
        await asyncio.sleep(phase_s)
        self.stop.set()
        for task in [*background, *self.tasks]:
            task.cancel()
        await asyncio.gather(*background, *self.tasks, return_exceptions=True)
        self.phase.roundtrips = self.throttle.roundtrips - before
        self.phase.span_s = phase_s
        self.phase.wake_delays_ms = list(self.throttle.wake_delays_ms)
        if self.sized:
            await self.count_reserved()
        return self.phase

    async def count_reserved(self) -> None:
        """Read from Redis how many small jobs asked the pool under its reserve, and queued."""
        pool = await self.throttle.status("pool")
        self.phase.reserved_asked = pool.reserved_asked
        self.phase.reserved_queued = pool.reserved_queued


def limits_for(load: Load) -> dict[str, int]:
    """Every key's limit: the pool, the flooder's org, the small orgs' ceilings, sub-tenants."""
    args = load.args
    per_tenant_per_min = load.small_rate_per_s * 60 / len(SMALL)
    small_base = earned_base(args.floor, per_tenant_per_min, load.mean_s)
    limits = {"pool": args.slots, f"org:{FLOODER}": args.slots}
    for tenant in SMALL:
        limits[f"org:{tenant}"] = ceiling(small_base, 2, 0.5)
    for i in range(args.subs):
        limits[f"sub:{FLOODER}/{i}"] = args.sub_limit
    return limits


def new_throttle(client: Redis, namespace: str) -> Throttle:
    """A throttle member on the benchmark's namespace."""
    return Throttle(
        client, prefix=load_settings().redis.key_prefix, namespace=namespace, default_limit=0
    )


async def delete_namespace(client: Redis, throttle: Throttle) -> None:
    """Delete every key of the throttle's namespace."""
    pattern = f"{keys.tag(throttle.prefix, throttle.namespace)}*"
    names = [name async for name in client.scan_iter(match=pattern)]
    if names:
        await client.delete(*names)


async def throttled(load: Load, client: Redis, name: str, flood: str) -> tuple[Phase, Throttle]:
    """Run one throttled phase on a namespace of its own."""
    throttle = new_throttle(client, f"bench-{uuid.uuid4().hex[:8]}")
    await throttle.start()
    try:
        phase = await ThrottledRun(load, throttle, name, flood=flood).run(load.args.phase_s)
    finally:  # a phase that failed or overran leaves no keys behind either
        await throttle.close()
        await delete_namespace(client, throttle)
    return phase, throttle


def member_main(
    args: argparse.Namespace,
    index: int,
    namespace: str,
    flood: str,
    start_at: float,
    out: Any,
    stats: Any,
) -> None:
    """One member process of the multi-member variant: its share of the load, its own member."""
    out.put(asyncio.run(_member(args, index, namespace, flood, start_at, stats)))


async def _member(
    args: argparse.Namespace,
    index: int,
    namespace: str,
    flood: str,
    start_at: float,
    stats: Any,
) -> dict[str, Any]:
    client = Redis.from_url(load_settings().redis.url)
    throttle = new_throttle(client, namespace)
    await throttle.start()
    await asyncio.sleep(max(0.0, start_at - time.time()))  # every member starts together
    load = Load(args, share=1 / MEMBERS, seed=index + 1)
    run = ThrottledRun(
        load, throttle, f"member{index}", flood=flood, sized=False, stats=stats, stats_index=index
    )
    phase = await run.run(args.phase_s)
    await throttle.close()
    await client.aclose()
    return {
        "small_waits": small_waits(phase),
        "done": dict(phase.done),
        "wake_delays_ms": phase.wake_delays_ms,
        "admissions": phase.admissions,
    }


async def multi_member(load: Load, client: Redis, name: str, flood: str) -> Phase:
    """Run one phase with the load split over ``MEMBERS`` processes sharing one throttle."""
    throttle = new_throttle(client, f"bench-{uuid.uuid4().hex[:8]}")
    await throttle.start()
    try:
        return await _multi_member(load, throttle, name, flood)
    finally:  # a phase that failed or overran leaves no keys behind either
        await throttle.close()
        await delete_namespace(client, throttle)


async def _multi_member(load: Load, throttle: Throttle, name: str, flood: str) -> Phase:
    sizing = ThrottledRun(load, throttle, name, flood=flood)
    await sizing.set_limits()
    ctx = mp.get_context("spawn")
    out, stats = ctx.Queue(), ctx.Queue()
    start_at = time.time() + 8.0  # after the members' imports, on a busy machine too
    members = [
        ctx.Process(
            target=member_main,
            args=(load.args, i, throttle.namespace, flood, start_at, out, stats),
        )
        for i in range(MEMBERS)
    ]
    for member in members:
        member.start()
    resizing = asyncio.create_task(fleet_resize_loop(sizing, stats))
    try:
        reports = [
            await asyncio.to_thread(out.get, timeout=3 * load.args.phase_s + 120) for _ in members
        ]
    finally:
        resizing.cancel()
        await asyncio.gather(resizing, return_exceptions=True)
    for member in members:
        member.join(timeout=30)
    await sizing.count_reserved()
    phase = sizing.phase
    phase.span_s = load.args.phase_s
    for report in reports:
        phase.waits_s["small"].extend(report["small_waits"])
        phase.wake_delays_ms.extend(report["wake_delays_ms"])
        phase.admissions += report["admissions"]
        for tenant, count in report["done"].items():
            phase.done[tenant] += count
    return phase


class Report(NamedTuple):
    """What one member tells the fleet's sizer each second."""

    member: int
    at: float
    """Wall-clock time of the report."""
    covers_s: float
    """The time since the member's previous report."""
    small_arrivals: int
    held_s: float
    """The summed slot holds of the jobs released in that time."""
    released: int


async def fleet_resize_loop(sizing: ThrottledRun, stats: Any) -> None:
    """Each second, re-size the pool's reserve from every member's rates of the last window.

    Each member's arrival rate is its small arrivals over the time its reports in the window
    cover, and the fleet's is their sum; the hold is the mean over every member's released jobs.
    Once no member has reported for a window (the phase is over), the plan stays as it was.
    """
    reported: list[Report] = []
    while True:
        await asyncio.sleep(1.0)
        while True:
            try:
                reported.append(stats.get_nowait())
            except queue.Empty:
                break
        reported = recent = [r for r in reported if r.at >= time.time() - RATE_WINDOW_S]
        released = sum(r.released for r in recent)
        if not released:
            continue
        rate = 0.0
        for member in {r.member for r in recent}:
            mine = [r for r in recent if r.member == member]
            rate += sum(r.small_arrivals for r in mine) / sum(r.covers_s for r in mine)
        mean = sum(r.held_s for r in recent) / released
        await sizing.size_reserve(rate, mean, mean)


def p_wait(phase: Phase) -> float | None:
    """The share of small jobs that queued on the pool, as Redis counted them."""
    if not phase.reserved_asked:
        return None
    return round(phase.reserved_queued / phase.reserved_asked, 4)


def small_waits(phase: Phase) -> list[float]:
    return [w for t in SMALL for w in phase.waits_s[t]]


def report(
    load: Load,
    calm: Phase,
    fifo: Phase,
    thr: Phase,
    subs: Phase,
    thr_t: Throttle,
    multi: tuple[Phase, Phase],
    args: argparse.Namespace,
) -> dict[str, object]:
    calm_p99, fifo_p99, thr_p99 = (percentile(small_waits(p), 99) for p in (calm, fifo, thr))
    small_done = sum(thr.done[t] for t in SMALL) / thr.span_s
    flood_done = thr.done[FLOODER] / thr.span_s
    left_per_s = load.capacity_per_s - small_done
    sub_rates = [subs.done[f"{FLOODER}/{i}"] / subs.span_s for i in range(args.subs)]
    wake = sorted(thr_t.wake_delays_ms)
    multi_calm, multi_flood = (percentile(p.waits_s["small"], 99) for p in multi)
    multi_wake = multi[1].wake_delays_ms + multi[0].wake_delays_ms
    multi_left = load.capacity_per_s - sum(multi[1].done[t] for t in SMALL) / multi[1].span_s
    rows = {
        "calm": calm,
        "fifo": fifo,
        "throttle": thr,
        "subtenants": subs,
    }
    print(
        f"{'phase':<11} {'small p50 ms':>12} {'small p99 ms':>12} {'small/s':>8} "
        f"{'flood/s':>8} {'util':>5} {'stranded s':>10}"
    )
    for name, p in rows.items():
        waits = sorted(small_waits(p))
        p50 = waits[len(waits) // 2] * 1000 if waits else 0.0
        flood = sum(v for k, v in p.done.items() if k.startswith(FLOODER)) / p.span_s
        util = p.busy_s / (args.slots * p.span_s)
        print(
            f"{name:<11} {p50:>12.2f} {percentile(waits, 99) * 1000:>12.2f} "
            f"{sum(p.done[t] for t in SMALL) / p.span_s:>8.1f} {flood:>8.1f} {util:>5.2f} "
            f"{p.stranded_slot_s:>10.3f}"
        )
    return {
        "bench": "fairness",
        "isolation_p99": round(thr_p99 / calm_p99, 2) if calm_p99 else None,
        "vs_fifo_p99": round(fifo_p99 / thr_p99, 1) if thr_p99 else None,
        "jain": round(jain(sub_rates), 3),
        "stranded_slot_s": round(thr.stranded_slot_s + subs.stranded_slot_s, 3),
        "over_admissions": thr.over_admissions + subs.over_admissions + calm.over_admissions,
        "flooder_share": round(flood_done / left_per_s, 3) if left_per_s > 0 else None,
        "flooder_share_bound": round(
            lendable_share(load.small_rate_per_s, args.slots, load.mean_s), 3
        ),
        "roundtrips_per_admission": round(thr.roundtrips / max(1, thr.admissions), 3),
        "wake_p99_ms": round(percentile(wake, 99), 2) if wake else None,
        "admissions_per_s": round(thr.admissions / thr.span_s, 1),
        "reserve": thr.reserve,
        "headroom": thr.headroom,
        "p_wait": p_wait(thr),
        "p_wait_planned": round(thr.p_wait_planned, 4),
        "multi_member_isolation_p99": round(multi_flood / multi_calm, 2) if multi_calm else None,
        "multi_member_wake_p99_ms": round(percentile(multi_wake, 99), 2) if multi_wake else None,
        "multi_member_flooder_share": (
            round(multi[1].done[FLOODER] / multi[1].span_s / multi_left, 3)
            if multi_left > 0
            else None
        ),
        "multi_member_reserve": multi[1].reserve,
        "multi_member_headroom": multi[1].headroom,
        "multi_member_p_wait": p_wait(multi[1]),
        "multi_member_p_wait_planned": round(multi[1].p_wait_planned, 4),
        "small_p99_ms": {
            "calm": round(calm_p99 * 1000, 2),
            "fifo": round(fifo_p99 * 1000, 1),
            "throttle": round(thr_p99 * 1000, 2),
            "subtenants": round(percentile(small_waits(subs), 99) * 1000, 2),
            "multi_member_calm": round(multi_calm * 1000, 2),
            "multi_member_throttle": round(multi_flood * 1000, 2),
        },
        "slots": args.slots,
        "phase_s": args.phase_s,
        "flood_x": args.flood_x,
    }


def wait_series(phases: list[Phase]) -> list[dict[str, Any]]:
    """Per phase, tenant class and 1-second window of start time: jobs started, their p99 wait."""
    rows: list[dict[str, Any]] = []
    for phase in phases:
        windows = max(1, math.ceil(phase.span_s))
        waits: dict[tuple[str, int], list[float]] = defaultdict(list)
        for cls, submitted, started in phase.jobs:
            waits[cls, min(windows - 1, int(started))].append(started - submitted)
        present = {cls for cls, _ in waits}
        for cls in (c for c in ("small", "flooder") if c in present):
            for second in range(windows):
                mine = waits.get((cls, second), [])
                rows.append(
                    {
                        "phase": phase.name,
                        "class": cls,
                        "second": second,
                        "jobs": len(mine),
                        "p99_wait_ms": round(percentile(mine, 99) * 1000, 3) if mine else "",
                    }
                )
    return rows


def plot(args: argparse.Namespace, rows: list[dict[str, Any]], path: Path) -> bool:
    """The p99 waits over time, one panel per phase, as a PNG; False without matplotlib."""
    try:
        import matplotlib as mpl  # noqa: PLC0415 - optional

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - optional
    except ImportError:
        return False
    titles = {
        "calm": "calm: throttle, no flood",
        "fifo": "fifo: one shared FIFO queue, flood",
        "throttle": "throttle: flood from one org",
        "subtenants": f"subtenants: flood over {args.subs} sub-tenant keys",
    }
    values = [r["p99_wait_ms"] for r in rows if r["p99_wait_ms"] != "" and r["p99_wait_ms"] > 0]
    log = bool(values) and max(values) / min(values) > 100
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True, sharey=True)
    for ax, (phase, title) in zip(axes.flat, titles.items(), strict=True):
        # The flooder first and wider, so the small tenants' line stays visible where they meet.
        for cls, color, width, label in (
            ("flooder", "tab:red", 3.0, "flooder"),
            ("small", "tab:blue", 1.5, "small tenants (50)"),
        ):
            mine = [r for r in rows if r["phase"] == phase and r["class"] == cls]
            if not mine:
                continue
            xs = [r["second"] + 0.5 for r in mine]
            ys = [r["p99_wait_ms"] if r["p99_wait_ms"] != "" else math.nan for r in mine]
            ax.plot(xs, ys, color=color, linewidth=width, marker=".", label=f"{label}: p99 wait")
        ax.set_title(title, fontsize=10)
        ax.grid(visible=True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    if log:
        axes[0, 0].set_yscale("log")
    for ax in axes[1]:
        ax.set_xlabel("time since phase start (s; 1 s windows by job start)")
    for ax in axes[:, 0]:
        ax.set_ylabel("p99 wait, submission to start (ms)")
    fig.suptitle(
        f"Noisy neighbour: p99 wait per 1 s window ({args.slots} slots, 50 small tenants "
        f"at {args.small_load:.0%} of capacity, flood {args.flood_x:g}x capacity)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_series(args: argparse.Namespace, phases: list[Phase]) -> None:
    """Write ``fairness.csv`` and ``fairness.png`` into ``--out`` (after all phases ran)."""
    rows = wait_series(phases)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "fairness.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, ["phase", "class", "second", "jobs", "p99_wait_ms"])
        writer.writeheader()
        writer.writerows(rows)
    png = args.out / "fairness.png"
    wrote = plot(args, rows, png)
    print(f"wrote {args.out / 'fairness.csv'}" + (f", {png}" if wrote else ""), file=sys.stderr)


async def watched(coro: Coroutine[Any, Any, T], name: str, limit_s: float) -> T:
    """Run one phase; if it overruns, print every task's stack (to find what hangs) and fail."""
    started = time.monotonic()
    try:
        result = await asyncio.wait_for(coro, limit_s)
    except TimeoutError:
        for task in asyncio.all_tasks():
            task.print_stack(limit=8, file=sys.stderr)
        raise
    print(f"phase {name} done in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return result


async def main(args: argparse.Namespace) -> dict[str, object]:
    load = Load(args)
    settings = load_settings()
    client = Redis.from_url(settings.redis.url)
    try:
        await client.ping()
        print(
            f"capacity {load.capacity_per_s:.0f} jobs/s ({args.slots} slots, mean "
            f"{load.mean_s * 1000:.1f} ms); small tenants {load.small_rate_per_s:.0f} jobs/s; "
            f"flood {args.flood_x}x capacity",
            file=sys.stderr,
        )
        limit_s = 3 * args.phase_s + 60
        calm, _ = await watched(throttled(load, client, "calm", "none"), "calm", limit_s)
        fifo = await watched(run_fifo(load, args.phase_s), "fifo", limit_s)
        thr, thr_t = await watched(throttled(load, client, "throttle", "org"), "throttle", limit_s)
        subs, _ = await watched(throttled(load, client, "subtenants", "subs"), "subs", limit_s)
        m_calm = await watched(multi_member(load, client, "multi_calm", "none"), "multi", limit_s)
        m_thr = await watched(multi_member(load, client, "multi_flood", "org"), "multi", limit_s)
    finally:
        await client.aclose()
    result = report(load, calm, fifo, thr, subs, thr_t, (m_calm, m_thr), args)
    write_series(args, [calm, fifo, thr, subs])
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--slots", type=int, default=16, help="worker slots (the pool limit)")
    parser.add_argument("--phase-s", type=float, default=20.0, help="seconds per phase")
    parser.add_argument("--median-ms", type=float, default=50.0, help="handler median latency")
    parser.add_argument(
        "--small-load",
        type=float,
        default=0.25,
        help="the 50 small tenants' load as a share of capacity",
    )
    parser.add_argument("--flood-x", type=float, default=20.0, help="flood rate / capacity")
    parser.add_argument("--floor", type=int, default=2, help="per-tenant floor (priority gate)")
    parser.add_argument("--subs", type=int, default=20, help="sub-tenant keys of the flood")
    parser.add_argument("--sub-limit", type=int, default=2, help="limit of each sub-tenant key")
    parser.add_argument(
        "--reserve",
        type=int,
        default=-1,
        help="pool slots kept for tenants under their floor (default: sized, re-sized each second)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="where the CSV and PNG go")
    return parser.parse_args()


if __name__ == "__main__":
    result = asyncio.run(main(parse_args()))
    print(json.dumps(result))
