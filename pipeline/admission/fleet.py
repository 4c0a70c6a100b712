"""Dynamic per-org limits applied by the fleet: every member reports, one member recomputes.

Every ``interval_s`` each member (``pipeline consume`` with ``throttle.dynamic.enabled``):

1. adds the submissions and finished-job durations it counted per org since its last tick to
   the org's per-minute stats (:class:`~pipeline.admission.limits.LimitTracker`: one Redis
   Functions call per 125 orgs it saw, about a millisecond of Redis each) and marks those orgs
   as seen;
2. reports its own load, handlers running and its slot limit, in the fleet hash;
3. tries to claim the tick (``SET NX`` on the tick's key): the one member that wins reads the
   fleet hash (members silent for three intervals are dropped from it), so the fleet size is
   read once per tick, off the hot path, and sets ``org:ORG`` of every org seen within the stats
   window with :meth:`~pipeline.admission.limits.LimitTracker.recompute`: each org earns the
   concurrency its recent traffic needs plus burst room, and when the fleet runs more than
   ``pool_ratio`` of its slots every ceiling shrinks by the same factor. With more than
   :data:`ORGS_A_TICK` orgs in the window (a producer sending each message with a new
   ``pl-tenant``), a tick sets that many: the orgs with work in the throttle, the ones this
   member counted most jobs of, and a slice of the rest that moves on each tick. The factor
   itself is set for the whole namespace at every tick (:meth:`Throttle.set_factor`) and each
   org's own part (:class:`~pipeline.admission.shares.Share`) beside its limit, so admission
   scales every org by the factor now: one the tick did not reach again is admitted up to its
   share of the fleet as it is, not as it was when its limit was last set (up to
   ``f_max / f_min``, 8, times that share). The tick also drops a step of the shares left
   without a limit (:meth:`Throttle.prune_shares`: orgs a member of an earlier release forgot).

So a flooding org earns more only while the fleet has room for it; once the pool is full, its
share shrinks with everyone's and its floor-protected neighbours keep theirs. Redis unavailable:
the tick is skipped (logged); the limits last set stay in force. A member's load report in
the fleet hash that cannot be read is deleted with a warning (it reports again at its next tick).
Any other failure of a tick (a bug) is logged with its traceback and skipped the same way: the
fleet task never ends before the member does. A computed limit
above the most a throttle takes is no failure: it is set as that most, with a warning.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline.admission import keys as k
from pipeline.admission.limits import (
    ORGS_A_ROUND_TRIP,
    WINDOW_MIN,
    LimitPolicy,
    LimitTracker,
    load_org_overrides,
    load_policy,
    pressure_factor,
)
from pipeline.admission.throttle import Throttle
from pipeline.config import Settings

log = logging.getLogger(__name__)

STALE_TICKS = 3
"""A member that has not reported for this many intervals no longer counts in the fleet."""
ORGS_A_TICK = 10_000
"""Most orgs whose limits one tick sets, and most gone orgs it removes: with 100,000 orgs in the
window, a quiet tick takes 0.2 to 0.4 s of a 10 s interval and 66 to 71 commands (0.4 MB sent).
Every org seen recomputed at every tick, a flood of 100,000 one-message tenants took 6 to 10 s
a tick, over a thousand calls and 10 to 23 MB sent, 36 times in the window."""


class FleetLimits:
    """One member's part in the dynamic limits of the fleet."""

    def __init__(
        self,
        client: Redis,
        prefix: str,
        throttle: Throttle,
        policy: LimitPolicy,
        *,
        member: str,
        load: Callable[[], tuple[int, int]] = lambda: (0, 0),
        interval_s: float = 10.0,
        pool_ratio: float = 0.8,
        orgs_a_tick: int = ORGS_A_TICK,
    ) -> None:
        """Report and recompute for ``member``; the member binds ``load`` (see :meth:`bind`).

        A tick sets the limits of at most ``orgs_a_tick`` orgs (see :meth:`_orgs_to_recompute`).
        """
        self._client = client
        self._prefix = prefix
        self._throttle = throttle
        self._policy = policy
        self._member = member
        self._load = load
        self._interval_ms = round(interval_s * 1000)
        self._pool_ratio = pool_ratio
        self._orgs_a_tick = max(4, orgs_a_tick)
        self._tracker = LimitTracker(client, prefix)
        self._submitted: Counter[str] = Counter()
        self._finished: dict[str, list[float]] = {}
        self.recomputed = 0
        self.last: Mapping[str, int] = {}
        """The limits this member set at the last tick it won."""

    @classmethod
    def from_settings(cls, client: Redis, settings: Settings, throttle: Throttle) -> FleetLimits:
        """The fleet limits ``settings.throttle.dynamic`` configures, on ``throttle``'s keys."""
        dynamic = settings.throttle.dynamic
        policy = load_policy(dynamic.policy_file) if dynamic.policy_file else LimitPolicy()
        return cls(
            client,
            settings.redis.key_prefix,
            throttle,
            policy,
            member=throttle.member,
            interval_s=dynamic.interval_s,
            pool_ratio=dynamic.pool_ratio,
        )

    def bind(self, load: Callable[[], tuple[int, int]]) -> None:
        """Read this member's (handlers running, slot limit) from ``load`` at each tick."""
        self._load = load

    def submitted(self, org: str) -> None:
        """A job of ``org`` asked for admission.

        The org is counted, and known in Redis, by its :func:`~pipeline.admission.keys.org_name`:
        a ``pl-tenant`` over a kilobyte by its head and digest, as its throttle key names it, so
        the tick finds it among the keys with work (:meth:`_with_work`).
        """
        self._submitted[k.org_name(org)] += 1

    def finished(self, org: str, duration_s: float) -> None:
        """A job of ``org`` finished after ``duration_s`` seconds."""
        self._finished.setdefault(k.org_name(org), []).append(duration_s)

    async def tick(self, now_s: float | None = None) -> Mapping[str, int] | None:
        """Report, and recompute if this member wins the tick; returns the limits it set.

        Every time in a tick (which tick it is, the age of the members' reports, the minute
        the stats go to, when an org was last seen) is read from Redis (``TIME``), the one
        clock the whole fleet shares: judged by a member's own clock, a few seconds off (a VM
        resumed from suspend, a container without NTP), other members' reports looked stale
        and were dropped, orgs they saw looked gone and lost their limits, and stats went to
        minutes the recomputing member did not read. ``now_s`` stands for that clock (tests).
        """
        now_s = await self._server_s() if now_s is None else now_s
        now_ms = int(now_s * 1000)
        counted = await self._report(now_s, now_ms)
        tick = now_ms // self._interval_ms
        claimed = await self._client.set(
            k.limits_tick(self._prefix, tick), self._member, nx=True, px=self._interval_ms * 2
        )
        if not claimed:
            return None
        pool_target, in_flight = await self._fleet(now_ms)
        factor = pressure_factor(pool_target, in_flight, self._policy.f_min, self._policy.f_max)
        await self._throttle.set_factor(factor, self._interval_ms * STALE_TICKS)
        cutoff_ms = now_ms - (WINDOW_MIN + 1) * 60_000
        await self._forget_gone(cutoff_ms)
        await self._throttle.prune_shares()  # of orgs an earlier release's member forgot
        orgs = await self._orgs_to_recompute(cutoff_ms, counted)
        policy = await load_org_overrides(self._client, self._prefix, self._policy)
        self.last = await self._tracker.recompute(
            self._throttle,
            orgs,
            policy,
            pool_target=pool_target,
            in_flight=in_flight,
            now_s=now_s,
        )
        self.recomputed += 1
        return self.last

    async def _server_s(self) -> float:
        """Redis's clock, in seconds."""
        seconds, micros = await self._client.time()
        return int(seconds) + int(micros) / 1_000_000

    async def _forget_gone(self, cutoff_ms: int) -> None:
        """Orgs not seen since ``cutoff_ms`` back to the default limit, at most a tick's cap.

        An org gone quiet for the whole window goes back to the default limit: its entry in
        the throttle's limits hash is removed, so tenants that left leave nothing behind. A
        flood's orgs all leave in the same minute: the rest go at the next ticks.
        """
        seen = k.orgs_seen(self._prefix)
        gone: list[bytes] = await self._client.zrangebyscore(  # type: ignore[assignment]
            seen, "-inf", cutoff_ms, start=0, num=self._orgs_a_tick
        )
        if not gone:
            return
        await self._client.zrem(seen, *gone)
        await self._throttle.set_limits({f"org:{org.decode()}": None for org in gone})

    async def _orgs_to_recompute(self, cutoff_ms: int, counted: Counter[str]) -> list[str]:
        """The orgs whose limits this tick sets: every org of the window, or the cap of them.

        Up to ``orgs_a_tick`` orgs in the window: all of them, every tick. More (a producer
        sending each message with a new ``pl-tenant``): a quarter of the cap for the orgs with
        work held or waiting in the throttle, a quarter for the orgs this member counted most
        jobs of since its last tick, and the rest for a slice of the window's orgs, so the
        tick's work stays the same however many tenants the flood brings. The orgs with work
        and the slice each go on from where the last tick (of any member) stopped, kept in
        :func:`~pipeline.admission.keys.limits_cursor`: every org with work is reached within
        ``active / quarter`` ticks and every org of the window within ``window / slice`` ticks,
        however many tenants come and go meanwhile.
        """
        seen = k.orgs_seen(self._prefix)
        window = f"({cutoff_ms}"
        if await self._client.zcount(seen, window, "+inf") <= self._orgs_a_tick:
            members: list[bytes] = await self._client.zrangebyscore(seen, window, "+inf")  # type: ignore[assignment]
            return [org.decode() for org in members]
        share = self._orgs_a_tick // 4
        cursor: dict[bytes, bytes] = await self._client.hgetall(k.limits_cursor(self._prefix))  # type: ignore[assignment]
        busy, after = await self._with_work(share, cursor.get(b"active", b"").decode())
        picked = dict.fromkeys(await self._in_window(busy, cutoff_ms))
        for org, _ in counted.most_common(share):
            picked[org] = None
        ranked = await self._slice(self._orgs_a_tick - 2 * share, cursor.get(b"slice"))
        for member, score in ranked:
            if score > cutoff_ms:
                picked[member.decode()] = None
        where = k.limits_cursor(self._prefix)
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.hset(where, "active", after)
            if ranked:  # none: the window emptied meanwhile, and the cursor stays as it was
                last_member, last_score = ranked[-1]
                pipe.hset(where, "slice", f"{last_score!r} {last_member.decode()}")
            pipe.pexpire(where, (WINDOW_MIN + 1) * 60_000)
            await pipe.execute()
        return list(picked)

    async def _with_work(self, share: int, after: str) -> tuple[list[str], str]:
        """``share`` orgs with work in the throttle, in name order from past ``after``, wrapping.

        Returns them and the last one's name, where the next tick goes on. Cut at the first
        ``share`` names every tick, an org named later with work waiting was never among them.
        """
        active = [key[4:] for key in await self._throttle.active_keys() if key.startswith("org:")]
        if len(active) <= share:
            return active, after
        first = bisect.bisect_right(active, after)
        taken = (active[first:] + active[:first])[:share]
        return taken, taken[-1]

    async def _slice(self, size: int, cursor: bytes | None) -> list[tuple[bytes, float]]:
        """``size`` orgs of the seen set in (last seen, name) order from past ``cursor``, wrapping.

        ``cursor`` is the last org the slice reached, with the time it was seen then. Started
        at rank ``tick * size`` modulo the orgs seen, the slice jumped to an unrelated rank at
        each tick the count changed (tenants coming and going): a quiet org was reached at
        random, some never in their window. An org's place after the cursor only nears it as
        the slice goes on (new orgs go in above it, gone ones leave from below), so the slice
        reaches every org in one pass. Where the cursor's org was seen again since (or left),
        the slice goes on from the first org seen when it was last: a few orgs again, none
        skipped.
        """
        seen = k.orgs_seen(self._prefix)
        start = 0
        if cursor:
            at, _, name = cursor.decode().partition(" ")
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.zscore(seen, name)
                pipe.zrank(seen, name)
                pipe.zcount(seen, "-inf", f"({at}")
                score, rank, below = await pipe.execute()
            start = rank + 1 if score is not None and repr(float(score)) == at else below
        ranked: list[tuple[bytes, float]] = await self._client.zrange(  # type: ignore[assignment]
            seen, start, start + size - 1, withscores=True
        )
        if len(ranked) < size:  # the end of the seen set: on from its lowest ranks
            wrapped: list[tuple[bytes, float]] = await self._client.zrange(  # type: ignore[assignment]
                seen, 0, size - len(ranked) - 1, withscores=True
            )
            ranked += wrapped
        return ranked

    async def _in_window(self, orgs: list[str], cutoff_ms: int) -> list[str]:
        """Those of ``orgs`` seen since ``cutoff_ms``."""
        if not orgs:
            return []
        scores = await self._client.zmscore(k.orgs_seen(self._prefix), orgs)
        return [
            org for org, at in zip(orgs, scores, strict=True) if at is not None and at > cutoff_ms
        ]

    async def _report(self, now_s: float, now_ms: int) -> Counter[str]:
        """Add what this member counted to the stats and report its load; returns its counts."""
        submitted, self._submitted = self._submitted, Counter()
        finished, self._finished = self._finished, {}
        orgs = list(submitted)
        orgs += [org for org in finished if org not in submitted]
        # A thousand orgs at a time, their stats then their ZADD: a flood's 100,000 packed in
        # one pipeline held the member's event loop some 0.4 s (and one ZADD of 50,000 held
        # Redis up to 0.2 s).
        for start in range(0, len(orgs), ORGS_A_ROUND_TRIP):
            chunk = orgs[start : start + ORGS_A_ROUND_TRIP]
            counts = {org: (submitted[org], finished.get(org, [])) for org in chunk}
            await self._tracker.record_many(counts, now_s=now_s)
            await self._client.zadd(k.orgs_seen(self._prefix), dict.fromkeys(chunk, now_ms))
        running, slots = self._load()
        report = json.dumps({"running": running, "slots": slots, "at_ms": now_ms})
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.hset(k.fleet_load(self._prefix), self._member, report)
            pipe.pexpire(k.fleet_load(self._prefix), self._interval_ms * STALE_TICKS * 10)
            await pipe.execute()
        return submitted

    async def _fleet(self, now_ms: int) -> tuple[int, int]:
        """(pool target, handlers in flight) over the members that reported lately."""
        raw = await self._client.hgetall(k.fleet_load(self._prefix))
        slots = running = 0
        stale = []
        for member, value in raw.items():
            try:
                report = json.loads(value)
                at_ms, member_slots = int(report["at_ms"]), int(report["slots"])
                member_running = int(report["running"])
            except (ValueError, TypeError, KeyError) as exc:  # it would fail every tick
                log.warning(
                    "dynamic limits: member %r's load report in %s is unreadable (%s: %s);"
                    " deleted, it reports again at its next tick",
                    member,
                    k.fleet_load(self._prefix),
                    type(exc).__name__,
                    exc,
                )
                stale.append(member)
                continue
            if now_ms - at_ms > self._interval_ms * STALE_TICKS:
                stale.append(member)
                continue
            slots += member_slots
            running += member_running
        if stale:
            await self._client.hdel(k.fleet_load(self._prefix), *stale)
        return max(1, math.floor(slots * self._pool_ratio)), running

    async def run(self, stop: asyncio.Event) -> None:
        """Tick every interval until ``stop`` is set; a failed tick is logged and skipped.

        A Redis failure is one warning line; any other error (a bug) is logged with its
        traceback. Either way the next tick runs on time: the limits
        last set stay in force meanwhile, and the member goes on.
        """
        while not stop.is_set():
            try:
                await self.tick()
            except (rexc.RedisError, OSError) as exc:
                log.warning("dynamic limits: tick skipped, Redis unavailable: %s", exc)
            except Exception:
                log.exception(
                    "dynamic limits: tick failed, the limits last set stay in force; retrying"
                    " at the next tick"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_ms / 1000)
