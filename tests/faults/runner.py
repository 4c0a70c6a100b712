"""The scenario runner: signed webhook load through a real pipeline while faults are injected.

:func:`run` starts a :class:`~faults.cluster.Cluster`, sends every event of the scenario as a
signed webhook (one sender per key, each event after the previous one of its key was answered,
retrying like a provider until it gets a 2xx), fires each fault once the ingress has accepted
the fault's number of events (thresholds drawn from a seeded generator), then waits until every
accepted event is accounted for and checks the properties:

* P1: every accepted event had its side effect applied exactly once, or is in the DLQ with a
  reason; and the guard never let a side effect run twice (except where the scenario crashes the
  effect's own store mid-call: then a repeat is an ambiguous outcome, counted, and the receiving
  end's event-id key keeps the effect single);
* P2: per key, events were handled in topic order (and, when no produce could be lost or
  delayed, in the order the provider sent them);
* P4: member RSS and the number of keys in the scenario's Redis stayed under generous bounds.

Recovery time is the time from the end of the last fault to the moment the backlog was drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import psutil
from confluent_kafka import KafkaException
from faults.cluster import SECRET, Cluster
from ingress.signing import hub_signature
from redis.asyncio import Redis
from redis.exceptions import RedisError

from pipeline import headers as h
from pipeline.errors import TransportError
from pipeline.transport import create_transport
from pipeline.transport.kafka.group import admin_client
from pipeline.transport.protocol import Consumer, Transport

DEAD_REASONS = {"fatal", "exhausted", "poison", "sequenced", "expired", "shed"}
MAX_RSS_MB = 600
RESULTS: list[dict[str, object]] = []


@dataclass(frozen=True)
class Event:
    """One webhook: ``seq`` is its place in the whole run, ``mode`` what its handler does."""

    seq: int
    key: str
    mode: str = "ok"

    @property
    def id(self) -> str:
        """The provider's event id."""
        return f"evt-{self.seq}"

    def body(self) -> bytes:
        """The signed JSON body."""
        return json.dumps(
            {"id": self.id, "tenant": "t1", "key": self.key, "seq": self.seq, "mode": self.mode}
        ).encode()


@dataclass(frozen=True)
class Fault:
    """An action fired once the ingress has accepted ``at`` events."""

    name: str
    at: int
    action: Callable[[], Awaitable[None]]


@dataclass
class Scenario:
    """Events, faults and what to expect."""

    name: str
    events: list[Event]
    faults: list[Fault] = field(default_factory=list)
    rate_per_s: float = 150.0
    strict_order: bool = True
    repeats_allowed: bool = False
    deadline_s: float = 90.0


def make_events(count: int, keys: int, modes: dict[int, str] | None = None) -> list[Event]:
    """``count`` events spread round-robin over ``keys`` keys; ``modes`` by sequence number."""
    modes = modes or {}
    return [Event(n, f"k{n % keys}", modes.get(n, "ok")) for n in range(count)]


def thresholds(seed: int, count: int, total: int) -> list[int]:
    """``count`` seeded, increasing accepted-event counts inside the middle of the load."""
    rng = random.Random(seed)
    return sorted(rng.sample(range(total // 5, total * 4 // 5), count))


@dataclass
class Observer:
    """Reads what the members did: side effects in Redis, dead letters, RSS and key counts."""

    cluster: Cluster
    applied: dict[str, int] = field(default_factory=dict)
    dead: dict[str, str] = field(default_factory=dict)
    dead_errors: Counter[str] = field(default_factory=Counter)
    max_rss_mb: float = 0.0
    max_redis_keys: int = 0
    _transport: Transport | None = None
    _dlq: Consumer | None = None

    def __post_init__(self) -> None:
        """Open a Redis client on the scenario's private Redis."""
        self.redis = Redis.from_url(self.cluster.redis_url, socket_timeout=2)

    async def refresh(self) -> None:
        """Read dead letters, side effects and the samples once; a service down skips a part."""
        await self._read_dead_letters()
        with contextlib.suppress(RedisError, OSError):
            raw = await self.redis.hgetall(f"{self.cluster.prefix}:applied")
            self.applied = {k.decode(): int(v) for k, v in raw.items()}
            self.max_redis_keys = max(self.max_redis_keys, int(await self.redis.dbsize()))
        for pid in self.cluster.member_pids():
            with contextlib.suppress(psutil.Error):
                rss = psutil.Process(pid).memory_info().rss / 1_048_576
                self.max_rss_mb = max(self.max_rss_mb, rss)

    async def _read_dead_letters(self) -> None:
        try:
            if self._dlq is None:
                self._transport = create_transport(self.cluster.settings)
                dlq_group = f"dlq-{self.cluster.group}"
                self._dlq = self._transport.consumer(dlq_group, [self.cluster.spec.dead_letter])
            for message in await self._dlq.poll(500, 0.2):
                event_id = message.headers[h.EVENT_ID].decode()
                if event_id not in self.dead:
                    self.dead[event_id] = message.headers[h.DEAD_REASON].decode()
                    error = message.headers.get(h.ERROR_MESSAGE, b"").decode()[:60]
                    self.dead_errors[f"{self.dead[event_id]}: {error}"] += 1
        except Exception:  # the broker is down by design; reconnect next round
            await self._close_dlq()

    async def _close_dlq(self) -> None:
        with contextlib.suppress(Exception):
            if self._dlq is not None:
                await self._dlq.close()
            if self._transport is not None:
                await self._transport.close()
        self._dlq, self._transport = None, None

    async def runs(self) -> dict[str, int]:
        """How many times the guard let each event's side effect run."""
        raw = await self.redis.hgetall(f"{self.cluster.prefix}:runs")
        return {k.decode(): int(v) for k, v in raw.items()}

    async def reached(self) -> dict[str, list[int]]:
        """Per key, the seq of every run that reached the side effect, repeats included, in order.

        Recorded only by the crash-loop app (``crashloop_app.py``).
        """
        out: dict[str, list[int]] = {}
        async for name in self.redis.scan_iter(f"{self.cluster.prefix}:reached:*"):
            key = name.decode().rsplit(":", 1)[1]
            out[key] = [int(seq) for seq in await self.redis.lrange(name, 0, -1)]
        return out

    async def order(self) -> dict[str, list[tuple[int, int, int]]]:
        """Per key, ``(seq, partition, origin offset)`` in the order the side effects ran."""
        out: dict[str, list[tuple[int, int, int]]] = {}
        async for name in self.redis.scan_iter(f"{self.cluster.prefix}:order:*"):
            key = name.decode().rsplit(":", 1)[1]
            entries = [x.decode().split(":") for x in await self.redis.lrange(name, 0, -1)]
            out[key] = [(int(s), int(p), int(o)) for s, p, o in entries]
        return out

    async def close(self) -> None:
        """Close the clients."""
        await self._close_dlq()
        await self.redis.aclose()


class Accepted(set[str]):
    """Event ids the ingress answered 2xx; faults wait on its size."""

    def __init__(self) -> None:
        """Start empty."""
        super().__init__()
        self._grown = asyncio.Condition()

    async def accept(self, event_id: str) -> None:
        """Record a 2xx answer and wake whoever waits for a count."""
        async with self._grown:
            self.add(event_id)
            self._grown.notify_all()

    async def reach(self, count: int) -> None:
        """Wait until at least ``count`` events were accepted."""
        async with self._grown:
            await self._grown.wait_for(lambda: len(self) >= count)


async def _deliver(http: httpx.AsyncClient, event: Event, accepted: Accepted) -> None:
    body = event.body()
    headers = {"x-hub-signature-256": hub_signature(SECRET, body)}
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(httpx.HTTPError):
            response = await http.post("/hooks/hooks", content=body, headers=headers)
            if response.is_success:
                await accepted.accept(event.id)
                return
        assert time.monotonic() < deadline, f"{event.id} was never accepted"
        await asyncio.sleep(0.05)  # the provider's retry backoff (load, not synchronisation)


async def _load(url: str, scenario: Scenario, accepted: Accepted) -> None:
    by_key: dict[str, list[Event]] = defaultdict(list)
    for event in scenario.events:
        by_key[event.key].append(event)
    started = time.monotonic()

    async def sender(events: list[Event], http: httpx.AsyncClient) -> None:
        for event in events:
            delay = started + event.seq / scenario.rate_per_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing of the offered load
            await _deliver(http, event, accepted)

    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        await asyncio.gather(*(sender(events, http) for events in by_key.values()))


async def _inject(faults: list[Fault], accepted: Accepted) -> float | None:
    ended = None
    for fault in sorted(faults, key=lambda f: f.at):
        await accepted.reach(fault.at)
        await fault.action()
        ended = time.monotonic()
    return ended


async def run(cluster: Cluster, scenario: Scenario) -> dict[str, object]:
    """Run the scenario on ``cluster``, check P1, P2 and P4, and return its figures."""
    assert all(f.at < len(scenario.events) for f in scenario.faults)
    began = time.monotonic()
    await cluster.start()
    started = time.monotonic()
    observer = Observer(cluster)
    accepted = Accepted()
    try:
        load = asyncio.create_task(_load(cluster.url, scenario, accepted))
        injector = asyncio.create_task(_inject(scenario.faults, accepted))
        while not (load.done() and injector.done()):
            await observer.refresh()
        await load
        loaded = time.monotonic()
        fault_end = await injector or loaded
        deadline = time.monotonic() + scenario.deadline_s
        while not accepted <= observer.applied.keys() | observer.dead.keys():
            missing = sorted(accepted - observer.applied.keys() - observer.dead.keys())
            if time.monotonic() >= deadline:
                if cluster.transport == "redis":
                    state = await group_state(observer.redis)
                else:
                    state = await kafka_group_state(cluster)
                state += await guard_state(observer.redis) + cluster.member_logs()
                stuck = sorted({e.key for e in scenario.events if e.id in missing})
                state += cluster.decisions(stuck[:3]) + cluster.warnings()
                raise AssertionError(f"not drained: {len(missing)} {missing[:10]}{state}")
            await observer.refresh()
        drained = time.monotonic()
        order = await observer.order()
        runs = await observer.runs()
    finally:
        await observer.close()
        await cluster.stop()
    sent = {e.id for e in scenario.events}
    check_exactly_once(accepted, sent, observer.applied, observer.dead)
    repeats = {e: n for e, n in runs.items() if n > 1}
    assert scenario.repeats_allowed or not repeats, f"the guard ran effects again: {repeats}"
    check_key_order(order, strict=scenario.strict_order)
    assert observer.max_rss_mb < MAX_RSS_MB, f"member RSS {observer.max_rss_mb:.0f} MB"
    key_bound = 3 * len(scenario.events) + 200
    assert observer.max_redis_keys < key_bound, f"{observer.max_redis_keys} Redis keys"
    result: dict[str, object] = {
        "scenario": scenario.name,
        "transport": cluster.transport,
        "accepted": len(accepted),
        "applied": sum(1 for n in observer.applied.values() if n),
        "dead": dict(Counter(observer.dead.values())),
        "repeated_runs": sum(n - 1 for n in repeats.values()),
        "dead_errors": dict(observer.dead_errors),
        "recovery_s": round(drained - fault_end, 2),
        "member_restarts": cluster.restarts,
        "crashes": dict(Counter(cluster.crashes)),
        "max_rss_mb": round(observer.max_rss_mb),
        "max_redis_keys": observer.max_redis_keys,
        "start_s": round(started - began, 1),
        "load_s": round(loaded - started, 1),
        "wall_s": round(time.monotonic() - began, 1),
    }
    RESULTS.append(result)
    print(json.dumps(result))  # noqa: T201 - the figures are part of the test's output
    return {**result, "dead_by_id": dict(observer.dead)}


async def group_state(redis: Redis) -> str:
    """The Redis transport's group state, for a scenario that did not drain.

    Leases, live members and, per stream, who holds how many pending entries.
    """
    lines = []
    with contextlib.suppress(RedisError, OSError):
        async for key in redis.scan_iter(match="*}:owners"):
            leases = {k.decode(): v.decode() for k, v in (await redis.hgetall(key)).items()}
            lines.append(f"{key.decode()} {dict(sorted(leases.items()))}")
        lines += [
            f"{key.decode()} {await redis.zrange(key, 0, -1, withscores=True)}"
            async for key in redis.scan_iter(match="*}:members")
        ]
        async for key in redis.scan_iter(match="*}:s", _type="stream"):
            for group in await redis.xinfo_groups(key):
                pending = await redis.xpending(key, group["name"])
                if pending["pending"]:
                    lines.append(f"{key.decode()} pending {pending['consumers']}")
    return "".join(f"\n  {line}" for line in lines)


async def kafka_group_state(cluster: Cluster) -> str:
    """The Kafka group's state, for a scenario that did not drain.

    The group's state and members (with their assignments), then per partition of the lane's
    topics the committed position against the end offset.
    """
    lines: list[str] = []
    admin = admin_client(cluster.settings.kafka)
    try:
        future = admin.describe_consumer_groups([cluster.group])[cluster.group]
        group = await asyncio.to_thread(future.result, 10)
        lines.append(f"group {cluster.group} {group.state}")
        for member in group.members:
            owned = member.assignment.topic_partitions
            names = sorted(f"{tp.topic}[{tp.partition}]" for tp in owned)
            lines.append(f"  {member.group_instance_id or member.client_id} {names}")
    except KafkaException as exc:
        lines.append(f"group {cluster.group}: not described: {exc}")
    transport = create_transport(cluster.settings)
    try:
        for topic in cluster.spec.topic_names():
            with contextlib.suppress(TransportError):
                lags = await transport.admin().group_lag(cluster.group, topic)
                positions = (f"{lag.tp.partition}:{lag.committed}/{lag.end}" for lag in lags)
                lines.append(f"{topic} committed/end {' '.join(positions)}")
    finally:
        await transport.close()
    return "".join(f"\n  {line}" for line in lines)


async def guard_state(redis: Redis) -> str:
    """The run guard's state, for a scenario that did not drain.

    Live member processes, claimed ranges, start marks and lone starts still held, releases in
    progress, and each parked key with its parked messages and held followers. A read that
    fails is said in its place.
    """
    lines: list[str] = []
    for pattern in ("*}:live", "*}:claims:*", "*}:run", "*}:alone", "*}:parked", "*}:h:*"):
        try:
            async for key in redis.scan_iter(match=pattern, _type="hash"):
                fields = await redis.hgetall(key)
                lines.append(f"{key.decode()} {len(fields)} {dict(list(fields.items())[:20])}")
        except (RedisError, OSError) as exc:
            lines.append(f"{pattern}: not read: {exc!r}")
    for pattern in ("*}:rel", "*}:z:*"):
        try:
            async for key in redis.scan_iter(match=pattern, _type="zset"):
                members = await redis.zrange(key, 0, 19, withscores=True)
                lines.append(f"{key.decode()} {members}")
        except (RedisError, OSError) as exc:
            lines.append(f"{pattern}: not read: {exc!r}")
    try:
        lines += [
            f"{key.decode()} held {sorted(await redis.hkeys(key))[:20]}"
            async for key in redis.scan_iter(match="*}:f:*", _type="hash")
        ]
    except (RedisError, OSError) as exc:
        lines.append(f"held followers: not read: {exc!r}")
    return "".join(f"\n  {line}" for line in lines)


def check_exactly_once(
    accepted: set[str], sent: set[str], applied: dict[str, int], dead: dict[str, str]
) -> None:
    """P1: each accepted event applied exactly once or dead-lettered with a known reason."""
    assert accepted == sent, f"never accepted: {sorted(sent - accepted)[:10]}"
    twice = {e: n for e, n in applied.items() if n > 1}
    assert not twice, f"side effects applied more than once: {twice}"
    assert applied.keys() <= sent
    assert set(dead.values()) <= DEAD_REASONS, dead
    lost = {e for e in accepted if applied.get(e) != 1 and e not in dead}
    assert not lost, f"neither handled nor dead-lettered: {sorted(lost)}"


def check_key_order(order: dict[str, list[tuple[int, int, int]]], *, strict: bool) -> None:
    """P2: per key, side effects ran in topic order (and in send order when ``strict``)."""
    for key, entries in order.items():
        partitions = {p for _, p, _ in entries}
        assert len(partitions) == 1, f"key {key} on partitions {partitions}"
        offsets = [o for _, _, o in entries]
        assert offsets == sorted(offsets), f"key {key} out of topic order: {entries}"
        if strict:
            seqs = [s for s, _, _ in entries]
            assert seqs == sorted(seqs), f"key {key} out of send order: {entries}"
