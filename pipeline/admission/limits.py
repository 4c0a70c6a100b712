"""Dynamic per-org concurrency limits: an earned base, a burst ceiling, and pressure sharing.

The formulas (Little's law: R submissions a minute of D seconds each keep ``R * D / 60`` jobs in
flight)::

    base    = max(floor, ceil(R * D / 60))
    ceiling = base + max(burst_floor, ceil(base * burst_pct))
    factor  = clamp(pool_target / in_flight, f_min, f_max)      (f_max when nothing is in flight)
    limit   = max(floor, floor(ceiling * factor)) + dedicated

so every org keeps its floor, a steady org earns what its traffic needs plus burst room, and
when the fleet is over-committed every ceiling shrinks by the same factor. Per-org floors, burst
settings and dedicated capacity are :class:`OrgLimits`, loaded from YAML or from a Redis hash
and so changed without a redeploy. :class:`LimitTracker` keeps each org's recent submissions and
durations in a small per-minute Redis hash (one fixed-size read per org) and recomputes the
limits off the hot path, writing them with :meth:`Throttle.set_shares`: each limit with the
org's own part of it (:class:`~pipeline.admission.shares.Share`), which admission scales by the
fleet's factor now, however long ago the org's limit was last computed.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis import exceptions as rexc
from redis.asyncio import Redis, RedisCluster

from pipeline.admission import keys as k
from pipeline.admission.limit_functions import LimitFunctions
from pipeline.admission.shares import MAX_LIMIT, Share
from pipeline.admission.throttle import Throttle
from pipeline.errors import ConfigError
from pipeline.topics.spec import read_yaml
from pipeline.validation import field_path

log = logging.getLogger(__name__)

WINDOW_MIN = 5
"""Minutes of history behind R and D."""
ORGS_A_ROUND_TRIP = 1000
"""Orgs whose stats one pipeline writes or reads (on a Redis Cluster)."""
ORGS_A_CALL = 125
"""Orgs whose stats one ``lim_record`` or ``lim_read`` call writes or reads: about 1 ms of Redis
on a quiet host, during which every other client waits (250: 2 to 2.6 ms, and twice that on a
loaded host). A 50,000-org tick makes 800 such calls instead of 400, with no wall time to see
beside the member's own work on each org (some 2.4 s either way)."""
ORGS_A_SET = 500
"""Orgs whose stats :meth:`LimitTracker.recompute` reads, and whose limits it computes and sets
(one ``thr_set_limits`` call), before it reads the next ones: the member's event loop is never
held by more than these orgs' work (a 100,000-org tick held it 0.3 to 0.5 s at a time)."""
_CLEANUP_SPAN_MIN = 10  # stale minutes deleted on each write; with the key TTL this bounds the hash


class OrgLimits(BaseModel):
    """One org's limit settings (or the defaults for orgs without their own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    floor: int = Field(default=2, ge=0)
    """Concurrency the org can always count on, even under pressure."""
    burst_floor: int = Field(default=2, ge=0)
    """Least burst room above the earned base."""
    burst_pct: float = Field(default=0.5, ge=0, allow_inf_nan=False)
    """Burst room as a share of the earned base."""
    dedicated: int = Field(default=0, ge=0)
    """Capacity reserved for this org, added on top of everything else."""


class LimitPolicy(BaseModel):
    """The fleet-wide factors and the per-org settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    defaults: OrgLimits = Field(default_factory=OrgLimits)
    orgs: dict[str, OrgLimits] = Field(default_factory=dict)
    f_min: float = Field(default=0.25, gt=0, allow_inf_nan=False)
    """Least pressure factor: how far ceilings shrink when the pool is over-committed."""
    f_max: float = Field(default=2.0, gt=0, allow_inf_nan=False)
    """Greatest pressure factor: how far ceilings grow when the pool is idle."""

    def for_org(self, org: str) -> OrgLimits:
        """``org``'s settings, or the defaults.

        ``org`` and the names in :attr:`orgs` are each a ``pl-tenant`` as sent or its
        :func:`~pipeline.admission.keys.org_name` (the window names one over a kilobyte by head
        and digest; a release before named it, and an operator types it, in full): an entry
        under either name of the org applies, its exact name first.
        """
        found = self.orgs.get(org)
        if found is None:
            found = self._by_org_name().get(k.org_name(org))
        return self.defaults if found is None else found

    def _by_org_name(self) -> dict[str, OrgLimits]:
        """:attr:`orgs` by :func:`~pipeline.admission.keys.org_name`, built once per ``orgs``."""
        orgs, named = self._named_orgs
        if orgs is not self.orgs:  # model_copy(update=...) copied another ``orgs``' table
            del self.__dict__["_named_orgs"]
            orgs, named = self._named_orgs
        return named

    @cached_property
    def _named_orgs(self) -> tuple[dict[str, OrgLimits], dict[str, OrgLimits]]:
        return self.orgs, {k.org_name(name): limits for name, limits in self.orgs.items()}


def earned_base(floor: int, rate_per_min: float, duration_s: float) -> int:
    """``max(floor, ceil(R * D / 60))``: the jobs in flight the org's recent traffic needs.

    Demand with no job finished in the window (``D`` unknown, 0) needs one job in flight, as
    any measured ``D`` would give: otherwise an org with ``floor`` and ``burst_floor`` 0, once
    squeezed to 0 while its jobs waited, could never finish one to measure ``D`` by, and would
    stay at 0 for as long as its jobs kept arriving, however idle the fleet.
    """
    needed = math.ceil(max(rate_per_min, 0.0) * max(duration_s, 0.0) / 60.0)
    if rate_per_min > 0:
        needed = max(needed, 1)
    return max(floor, needed)


def ceiling(base: int, burst_floor: int, burst_pct: float) -> int:
    """``base + max(burst_floor, ceil(base * burst_pct))``."""
    return base + max(burst_floor, math.ceil(base * burst_pct))


def pressure_factor(pool_target: int, in_flight: int, f_min: float, f_max: float) -> float:
    """``clamp(pool_target / in_flight, f_min, f_max)``; ``f_max`` when nothing is in flight."""
    if in_flight <= 0:
        return f_max
    return min(f_max, max(f_min, pool_target / in_flight))


def org_share(org: OrgLimits, *, rate_per_min: float, duration_s: float) -> Share:
    """The org's own part of its limit: its ceiling, floor and dedicated capacity."""
    base = earned_base(org.floor, rate_per_min, duration_s)
    top = ceiling(base, org.burst_floor, org.burst_pct)
    return Share(top, org.floor, org.dedicated)


def dynamic_limit(
    org: OrgLimits,
    *,
    rate_per_min: float,
    duration_s: float,
    pool_target: int,
    in_flight: int,
    f_min: float,
    f_max: float,
) -> int:
    """The org's limit now: its floor at least, plus its dedicated capacity on top."""
    share = org_share(org, rate_per_min=rate_per_min, duration_s=duration_s)
    return share.limit(pressure_factor(pool_target, in_flight, f_min, f_max))


_POLICY_VARIABLE = "PIPELINE_THROTTLE__DYNAMIC__POLICY_FILE"


def load_policy(path: Path) -> LimitPolicy:
    """Read a :class:`LimitPolicy` from a YAML file (an empty file: the defaults).

    Raises:
        ConfigError: the file cannot be read, is not YAML, is not a mapping or is no valid
            policy; each line names the file, the field and the variable that points at it.
    """
    where = f"(the limit policy, {_POLICY_VARIABLE})"
    document = read_yaml(path, ConfigError, where)
    if document is None:
        return LimitPolicy()
    if not isinstance(document, dict):
        raise ConfigError(
            f"{path}: expected a mapping such as 'defaults: {{floor: 2}}' {where},"
            f" got a {type(document).__name__}"
        )
    try:
        return LimitPolicy.model_validate(document)
    except ValidationError as exc:
        problems = [
            f"{path}: {field_path(e['loc'])}: {_policy_problem(e)} {where}" for e in exc.errors()
        ]
        raise ConfigError("\n".join(problems)) from None


def _policy_problem(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown field"
    message = str(error["msg"])
    return message[:1].lower() + message[1:]


async def load_org_overrides(client: Redis, prefix: str, policy: LimitPolicy) -> LimitPolicy:
    """``policy`` with the per-org settings stored in Redis (org -> JSON) laid over it.

    An entry that is not a valid :class:`OrgLimits` (written by hand, or by a newer release with
    a field this one lacks) is skipped with one warning line: its org keeps ``policy``'s settings
    and the other orgs' overrides still apply.
    """
    key = k.org_config(prefix)
    raw = await client.hgetall(key)
    orgs = dict(policy.orgs)
    for org, value in raw.items():
        name = org.decode(errors="replace") if isinstance(org, bytes) else str(org)
        try:
            orgs[name] = OrgLimits.model_validate_json(value)
        except ValidationError as exc:
            problems = "; ".join(
                f"{field_path(e['loc']) or 'the value'}: {e['msg']}" for e in exc.errors()
            )
            log.warning(
                "dynamic limits: the override of org %r in Redis hash %s is not valid (%s), so "
                "the policy's settings apply to it; store a valid one (store_org_override)",
                name,
                key,
                problems,
            )
    return policy.model_copy(update={"orgs": orgs})


async def store_org_override(client: Redis, prefix: str, org: str, limits: OrgLimits) -> None:
    """Store ``org``'s settings in Redis; the next recompute everywhere picks them up."""
    await client.hset(k.org_config(prefix), org, limits.model_dump_json())


class LimitTracker:
    """Recent submissions and durations per org, and the limits computed from them."""

    def __init__(self, client: Redis, prefix: str, *, window_min: int = WINDOW_MIN) -> None:
        """Keep ``window_min`` whole minutes of history per org under ``prefix``."""
        self._client = client
        self._prefix = prefix
        self._window_min = window_min
        # Each org's stats key is a hash tag of its own: a Redis Cluster refuses one call over
        # many of them, so there the same commands go in pipelines. A cluster reached through a
        # plain client (one shard holding every slot, or a proxy) says so at the first call.
        self._functions: LimitFunctions | None = (
            None if isinstance(client, RedisCluster) else LimitFunctions(client)
        )

    async def record(
        self,
        org: str,
        *,
        submitted: int = 0,
        durations_s: Iterable[float] = (),
        now_s: float | None = None,
    ) -> None:
        """Count ``submitted`` new jobs and add finished jobs' durations, in one round trip."""
        await self.record_many({org: (submitted, list(durations_s))}, now_s=now_s)

    async def record_many(
        self, counts: Mapping[str, tuple[int, Sequence[float]]], *, now_s: float | None = None
    ) -> None:
        """:meth:`record` for each org of ``counts`` (submitted, durations), in batches.

        :data:`ORGS_A_CALL` orgs go in one ``lim_record`` call (a Redis Cluster: a thousand in
        one pipeline of their commands): a tick's report costs a few round trips and a few
        microseconds of the member's CPU an org, however many tenants it counted. Sent one by
        one, or as five pipelined commands an org that redis-py packs and parses each, 50,000
        orgs took longer than the tick's interval.
        """
        minute = int((time.time() if now_s is None else now_s) // 60)
        stale = range(minute - self._window_min - _CLEANUP_SPAN_MIN, minute - self._window_min)
        gone = [f"{kind}:{m}" for m in stale for kind in "ncd"]
        fields = (f"n:{minute}", f"c:{minute}", f"d:{minute}")
        ttl_ms = (self._window_min + 1) * 60_000
        items = list(counts.items())
        step = ORGS_A_CALL if self._functions else ORGS_A_ROUND_TRIP
        for start in range(0, len(items), step):
            chunk = items[start : start + step]
            if not await self._record_called(chunk, fields, ttl_ms, gone):
                await self._record_pipelined(chunk, fields, ttl_ms, gone)

    async def _record_called(
        self,
        chunk: Sequence[tuple[str, tuple[int, Sequence[float]]]],
        fields: tuple[str, str, str],
        ttl_ms: int,
        gone: Sequence[str],
    ) -> bool:
        """``lim_record`` of ``chunk``; False, having written nothing, where it cannot be called."""
        if self._functions is None:
            return False
        try:
            await self._functions.record(
                [k.limit_stats(self._prefix, org) for org, _ in chunk],
                fields,
                ttl_ms,
                gone,
                [
                    (submitted, len(done), sum(done) if done else 0)
                    for _, (submitted, done) in chunk
                ],
            )
        except rexc.ClusterCrossSlotError as exc:
            self._refused(exc)
            return False
        return True

    def _refused(self, error: rexc.ClusterCrossSlotError) -> None:
        """Redis refused a call over several orgs' keys before running it: pipelines from now."""
        self._functions = None
        log.warning(
            "dynamic limits: Redis refuses one call over the stats of several orgs (CROSSSLOT: %s;"
            " a Redis Cluster reached through a plain client or a proxy), so each org's stats go"
            " in pipelines of their own commands from now on",
            error,
        )

    async def _record_pipelined(
        self,
        chunk: Sequence[tuple[str, tuple[int, Sequence[float]]]],
        fields: tuple[str, str, str],
        ttl_ms: int,
        gone: Sequence[str],
    ) -> None:
        """What ``lim_record`` does, as a pipeline of each org's commands (Redis Cluster)."""
        n_field, c_field, d_field = fields
        async with self._client.pipeline(transaction=False) as pipe:
            for org, (submitted, done) in chunk:
                key = k.limit_stats(self._prefix, org)
                if submitted:
                    pipe.hincrby(key, n_field, submitted)
                if done:
                    pipe.hincrby(key, c_field, len(done))
                    pipe.hincrbyfloat(key, d_field, sum(done))
                pipe.hdel(key, *gone)
                pipe.pexpire(key, ttl_ms)
            await pipe.execute()

    async def rates(self, org: str, *, now_s: float | None = None) -> tuple[float, float]:
        """(submissions per minute, mean duration in s) over the window up to now; one read."""
        return (await self.rates_many([org], now_s=now_s))[org]

    async def rates_many(
        self, orgs: Iterable[str], *, now_s: float | None = None
    ) -> dict[str, tuple[float, float]]:
        """:meth:`rates` of each org, :data:`ORGS_A_CALL` orgs a ``lim_read`` call."""
        now_s = time.time() if now_s is None else now_s
        wanted = list(dict.fromkeys(orgs))
        out: dict[str, tuple[float, float]] = {}
        step = ORGS_A_CALL if self._functions else ORGS_A_ROUND_TRIP
        for start in range(0, len(wanted), step):
            chunk = wanted[start : start + step]
            replies = await self._read([k.limit_stats(self._prefix, org) for org in chunk])
            for org, raw in zip(chunk, replies, strict=True):
                out[org] = self._rates_of(raw, now_s)
        return out

    async def _read(self, stats: Sequence[str]) -> Sequence[Mapping[Any, Any]]:
        """The ``stats`` hashes: one ``lim_read`` call, or a pipeline where it cannot be called."""
        if self._functions is not None:
            try:
                return await self._functions.read(stats)
            except rexc.ClusterCrossSlotError as exc:
                self._refused(exc)
        async with self._client.pipeline(transaction=False) as pipe:
            for key in stats:
                pipe.hgetall(key)
            replies: list[Mapping[Any, Any]] = await pipe.execute()
        return replies

    def _rates_of(self, raw: Mapping[Any, Any], now_s: float) -> tuple[float, float]:
        """(submissions per minute, mean duration in s) from an org's stats hash."""
        minute = int(now_s // 60)
        window = range(minute - self._window_min, minute + 1)
        sums = {"n": 0.0, "c": 0.0, "d": 0.0}
        for field, value in raw.items():
            kind, _, at = (field.decode() if isinstance(field, bytes) else field).partition(":")
            if kind in sums and int(at) in window:
                sums[kind] += float(value)
        # The current minute is partial: count it, but divide by the minutes actually covered.
        covered_min = self._window_min + (now_s % 60) / 60
        rate = sums["n"] / covered_min if covered_min > 0 else 0.0
        duration = sums["d"] / sums["c"] if sums["c"] else 0.0
        return rate, duration

    async def recompute(
        self,
        throttle: Throttle,
        orgs: Iterable[str],
        policy: LimitPolicy,
        *,
        pool_target: int,
        in_flight: int,
        now_s: float | None = None,
    ) -> Mapping[str, int]:
        """Compute each org's limit and set it on the throttle key ``org:ORG``; returns them.

        Run it periodically off the hot path with the cached fleet size (``pool_target``) and the
        fleet's current in-flight count. Each key gets its limit and the org's
        :class:`~pipeline.admission.shares.Share` (:meth:`Throttle.set_shares`), which admission
        scales by the factor the fleet sets at each tick. A limit above the most a throttle
        takes (:data:`~pipeline.admission.shares.MAX_LIMIT`, a huge ``floor`` or ``dedicated``)
        is set as that most, with a warning naming the org.
        """
        factor = pressure_factor(pool_target, in_flight, policy.f_min, policy.f_max)
        computed: dict[str, int] = {}
        wanted = list(dict.fromkeys(orgs))
        for start in range(0, len(wanted), ORGS_A_SET):
            chunk: dict[str, tuple[int, Share]] = {}
            rates = await self.rates_many(wanted[start : start + ORGS_A_SET], now_s=now_s)
            for org, (rate, duration) in rates.items():
                share = org_share(policy.for_org(org), rate_per_min=rate, duration_s=duration)
                chunk[org] = (self._limit_of(org, share, factor), share)
            await throttle.set_shares({f"org:{org}": pair for org, pair in chunk.items()})
            computed.update((org, limit) for org, (limit, _) in chunk.items())
        return computed

    @staticmethod
    def _limit_of(org: str, share: Share, factor: float) -> int:
        """``org``'s limit, :data:`~pipeline.admission.shares.MAX_LIMIT` at most (warned)."""
        limit = share.limit(factor)
        if limit > MAX_LIMIT:
            log.warning(
                "dynamic limits: org %r's limit comes to %d (floor %d, dedicated %d), above "
                "the most a throttle takes; it is set to %d: lower the org's floor or "
                "dedicated",
                org,
                limit,
                share.floor,
                share.dedicated,
                MAX_LIMIT,
            )
            return MAX_LIMIT
        return limit
