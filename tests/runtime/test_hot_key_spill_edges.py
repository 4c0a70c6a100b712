"""A hot key's queued messages sent away from a full partition: the edges of that path.

A partition paused full marks the messages queued behind a hot key's head to be deferred when
their turn comes (:meth:`Chain.spill`): the first parks its key through the first retry tier,
the others are held behind it in Redis and released in order. These tests run it against the
real brokers and Redis: what must not change (expiry, order, one run each) and what it must not
cost (a backlog of many keys spills nothing).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

from redis.asyncio import Redis
from runtime.helpers import (
    FAST,
    consuming,
    declare,
    eventually,
    lane_spec,
    private_member_env,
    produce,
    running,
)
from support import delete_group_after

from pipeline.config import RuntimeSettings
from pipeline.envelope import Message, Record
from pipeline.runtime import App, Context
from pipeline.runtime.app import Handler
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

SMALL = FAST.model_copy(
    update={"partition_high_water": 20, "partition_low_water": 10, "poll_max": 10}
)
"""A buffer of 20 filled by polls of 10 at most: the buffer bounds what the member holds."""
assert isinstance(SMALL, RuntimeSettings)


def _spilled(member: Member) -> bool:
    """Whether ``member`` marked messages to leave (a spill happened and is not settled)."""
    return bool(member._handler.deferred)


async def test_a_spilled_message_past_its_max_age_expires_instead_of_running(
    transport: Transport, redis_service: str, unique: str
) -> None:
    """A hot key's backlog waits past ``max_age`` behind its head; none of it runs.

    The message that parks the key went through the tier unexpired in the member, and its copy,
    whose ``max_age`` counts from its due time, ran: an expired message ran because it was
    spilled. Every message queued behind the head expires (dropped), in or out of Redis.
    """
    spec = lane_spec(
        f"hotexp_{unique}", 1, max_age="1s", on_expiry="drop", retry={"tiers": ["200ms"]}
    )
    await declare(transport, spec)
    app = App([spec])
    ran: list[bytes] = []
    release = asyncio.Event()

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        ran.append(event.value)
        if event.value == b"hot:0":
            await release.wait()

    hot = [Record(b"hot:%d" % n, b"hot") for n in range(40)]
    await produce(transport, spec.name, hot)
    produced_ms = int(time.time() * 1000)
    redis = Redis.from_url(redis_service)
    member = Member(app, transport, f"g-{unique}", SMALL, redis=redis, redis_prefix=f"t{unique}")
    try:
        async with running(member):
            await eventually(lambda: _spilled(member))
            # Every hot message is past its max_age (a condition on the clock, not a pause).
            await eventually(lambda: time.time() * 1000 > produced_ms + 1_500)
            release.set()
            await eventually(lambda: member.stats.expired + len(ran) >= 40)
    finally:
        await redis.aclose()
    assert ran == [b"hot:0"]
    assert member.stats.expired == 39


async def test_the_bench_backlog_of_many_keys_spills_nothing(
    transport: Transport, redis_service: str, unique: str
) -> None:
    """20,000 messages over 1,000 keys, 4 partitions, a no-op handler, the default settings.

    A backlog drained fast has a few messages queued behind each head: sending them away would
    only send them round through the tier and Redis for nothing. Nothing is deferred or parked.
    """
    spec = lane_spec(f"hotbench_{unique}", 4, retry={"tiers": ["1s", "5s"]})
    await declare(transport, spec)
    app = App([spec])
    handled = 0

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        nonlocal handled
        handled += 1

    await produce(transport, spec.name, [Record(b"x", b"k%d" % (i % 1_000)) for i in range(20_000)])
    settings = FAST
    redis = Redis.from_url(redis_service)
    member = Member(app, transport, f"g-{unique}", settings, redis=redis, redis_prefix=f"t{unique}")
    try:
        async with running(member):
            await eventually(lambda: handled >= 20_000, timeout_s=120)
    finally:
        await redis.aclose()
    assert (member.stats.deferred, member.stats.parked) == (0, 0)
    assert handled == 20_000


async def test_a_hot_keys_head_failing_while_its_followers_are_marked(
    transport: Transport, redis_service: str, unique: str
) -> None:
    """The head runs when the partition spills its followers, then fails once (retried).

    (While the head runs, its followers cannot leave and the partition sends no second batch
    away: the other keys behind them in the partition wait for it, as before the spill.)

    Its followers, marked to leave, are held behind its parked key; the key's messages run in
    order, each once (its head twice: attempt 1 failed, attempt 2 handled).
    """
    spec = lane_spec(f"hotfail_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    app = App([spec])
    done: dict[bytes, list[int]] = defaultdict(list)
    attempts: list[int] = []
    release = asyncio.Event()

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        n = int(event.value.split(b":")[1])
        if event.key == b"hot" and n == 0:
            attempts.append(ctx.attempt)
            if ctx.attempt == 1:
                await release.wait()
                raise RuntimeError("flaky dependency")
        done[event.key or b""].append(n)

    hot = [Record(b"hot:%d" % n, b"hot") for n in range(60)]
    cold = [Record(b"cold:%d" % n, b"cold%d" % n) for n in range(4)]
    await produce(transport, spec.name, [*hot, *cold])
    redis = Redis.from_url(redis_service)
    member = Member(app, transport, f"g-{unique}", SMALL, redis=redis, redis_prefix=f"t{unique}")
    try:
        async with running(member):
            await eventually(lambda: _spilled(member))
            release.set()
            await eventually(lambda: len(done[b"hot"]) >= 60)
            await eventually(lambda: all(done[b"cold%d" % n] for n in range(4)))
    finally:
        await redis.aclose()
    assert done[b"hot"] == list(range(60))
    assert attempts == [1, 2]


async def test_a_hot_run_of_messages_without_a_key(
    transport: Transport, redis_service: str, unique: str
) -> None:
    """An ordered lane's keyless messages are one key: spilled, they still run in order, once."""
    spec = lane_spec(f"hotnone_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    app = App([spec])
    ran: list[int] = []
    cold: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        n = int(event.value.split(b":")[1])
        if event.key is None:
            await asyncio.sleep(0.01)
            ran.append(n)
        else:
            cold.append(n)

    await produce(
        transport,
        spec.name,
        [
            *[Record(b"none:%d" % n, None) for n in range(60)],
            *[Record(b"cold:%d" % n, b"cold%d" % n) for n in range(4)],
        ],
    )
    redis = Redis.from_url(redis_service)
    member = Member(app, transport, f"g-{unique}", SMALL, redis=redis, redis_prefix=f"t{unique}")
    most = 0

    def bounded() -> bool:
        """Note the most messages the key lanes held (buffer and the batch sent away)."""
        nonlocal most
        most = max(most, member._chain.lanes.buffered)
        return len(ran) >= 60 and len(cold) == 4

    try:
        async with running(member):
            await eventually(bounded)
    finally:
        await redis.aclose()
    assert ran == list(range(60))
    assert member.stats.deferred >= 1
    # One batch a partition beside its buffer: the batch is what the buffer held when it
    # reached its high-water mark; the buffer takes at most the rest of a poll past it.
    assert most <= 2 * SMALL.partition_high_water + SMALL.poll_max - 1, most


async def test_a_revocation_mid_spill_leaves_the_marked_messages_to_the_next_owner(
    transport: Transport, redis_service: str, unique: str
) -> None:
    """The member leaves while its hot key's followers are marked to leave, its head running.

    The marks go with the revoked work (none left behind); the next owner reads the followers
    again and runs them, each once, in order, after the head.
    """
    spec = lane_spec(f"hotrev_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    app = App([spec])
    ran: list[int] = []
    release = asyncio.Event()

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        n = int(event.value.split(b":")[1])
        if n == 0:
            await release.wait()
        ran.append(n)

    await produce(transport, spec.name, [Record(b"hot:%d" % n, b"hot") for n in range(60)])
    redis = Redis.from_url(redis_service)
    try:
        first = Member(app, transport, f"g-{unique}", SMALL, redis=redis, redis_prefix=f"t{unique}")
        stop = asyncio.Event()
        task = asyncio.create_task(first.run(stop))
        await eventually(lambda: _spilled(first))
        stop.set()
        await eventually(lambda: not _spilled(first))  # revoked: the queued marks dropped
        release.set()
        await asyncio.wait_for(task, 60)
        after = Member(app, transport, f"g-{unique}", SMALL, redis=redis, redis_prefix=f"t{unique}")
        async with running(after):
            await eventually(lambda: len(ran) >= 60)
    finally:
        await redis.aclose()
    assert ran == list(range(60))


HOT_APP = '''
import asyncio
from pipeline.runtime import App, Context

app = App()


@app.handler("{lane}")
async def handle(event: bytes, ctx: Context) -> None:
    """Note each message's number once it ran (a slow hot key)."""
    await asyncio.sleep(0.02)
    with open("ran.txt", "a") as out:
        out.write(event.split(b":")[1].decode() + "\\n")
'''


async def test_a_member_killed_after_a_spill_loses_nothing(
    kafka: Transport, kafka_service: str, redis_service: str, unique: str, tmp_path: Path
) -> None:
    """`pipeline consume` killed (SIGKILL) once its spill parked its hot key, then started again.

    Nothing is lost: the followers held in Redis (their offsets committed) are released after
    the parked head's copy, the others read again; after the restart the key runs in order.
    """
    lane = f"hotkill_{unique}"
    spec = lane_spec(lane, 1, retry={"tiers": ["1s"]})
    await declare(kafka, spec)
    (tmp_path / "topics").mkdir()
    (tmp_path / "topics" / f"{lane}.yaml").write_text(
        f"name: {lane}\npartitions: 1\nordered: true\nretry:\n  tiers: [1s]\n"
    )
    (tmp_path / f"{lane}.py").write_text(HOT_APP.format(lane=lane))
    await produce(kafka, lane, [Record(b"hot:%d" % n, b"hot") for n in range(60)])
    env = private_member_env(tmp_path, kafka_service, redis_service, f"t{unique}")
    env.update(
        PIPELINE_RUNTIME__PARTITION_HIGH_WATER="20",
        PIPELINE_RUNTIME__PARTITION_LOW_WATER="10",
        PIPELINE_RUNTIME__POLL_MAX="10",
        PIPELINE_RUNTIME__COMMIT_INTERVAL_MS="100",
    )
    group = f"g-{unique}"
    delete_group_after(kafka, group, spec.topic_names())
    ran = tmp_path / "ran.txt"
    redis = Redis.from_url(redis_service)
    parked = f"{{t{unique}:guard:{lane}}}:parked"
    try:
        async with consuming(tmp_path, f"{lane}:app", group, env) as proc:
            await eventually_async(lambda: _hlen(redis, parked))
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        before = _numbers(ran)
        async with consuming(tmp_path, f"{lane}:app", group, env):
            await eventually(lambda: set(_numbers(ran)) >= set(range(60)), timeout_s=90)
    finally:
        await redis.aclose()
    after = _numbers(ran)[len(before) :]
    assert before == sorted(before), (before, after)
    # A message that ran just before the kill, its offset not committed yet, is read again and
    # held behind the key its follower parked: it runs a second time after that follower (the
    # guard's; a failure parking the key does the same). The others run once, in order.
    fresh = [n for n in after if n not in before]
    assert fresh == sorted(set(fresh)), (before, after)
    assert sorted(set(before) | set(after)) == list(range(60))


async def _hlen(redis: Redis, key: str) -> bool:
    """Whether hash ``key`` has fields."""
    return bool(await redis.hlen(key))  # type: ignore[misc]


async def eventually_async(predicate: Callable[[], Awaitable[bool]]) -> None:
    """Wait until ``await predicate()`` holds (re-checked every 10 ms); fail after 60 s."""
    deadline = time.monotonic() + 60
    while not await predicate():
        assert time.monotonic() < deadline, "condition not met after 60s"
        await asyncio.sleep(0.01)


def _numbers(path: Path) -> list[int]:
    """The numbers written to ``path``, one a line (none if it is not there yet)."""
    return [int(line) for line in path.read_text().split()] if path.exists() else []


async def test_a_spilled_hot_key_runs_each_ctx_once_effect_once(
    transport: Transport, redis_service: str, unique: str
) -> None:
    """A hot key's messages each make one ``ctx.once`` effect: spilled, each effect runs once."""
    spec = lane_spec(f"hotonce_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    app = App([spec])
    effects: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        n = int(event.value.split(b":")[1])

        async def effect() -> None:
            effects.append(n)

        await asyncio.sleep(0.01)
        await ctx.once("send", effect)

    await produce(transport, spec.name, [Record(b"hot:%d" % n, b"hot") for n in range(60)])
    redis = Redis.from_url(redis_service)
    member = Member(app, transport, f"g-{unique}", SMALL, redis=redis, redis_prefix=f"t{unique}")
    try:
        async with running(member):
            await eventually(lambda: len(effects) >= 60)
    finally:
        await redis.aclose()
    assert effects == list(range(60))
    assert member.stats.deferred >= 1


def crunch(event: bytes, ctx: Context) -> None:
    """A CPU handler: note the message's number (``PATH|N``) in the file it names."""
    path, n = event.decode().split("|")
    with Path(path).open("a") as out:
        out.write(n + "\n")


async def test_a_spilled_hot_key_of_a_cpu_lane_with_heartbeats(
    transport: Transport,
    redis_service: str,
    unique: str,
    tmp_path: Path,
) -> None:
    """A ``cpu=True`` lane with ``heartbeat_timeout``: its spilled hot key runs in order, once."""
    spec = lane_spec(f"hotcpu_{unique}", 1, retry={"tiers": ["200ms"]}, heartbeat_timeout="30s")
    await declare(transport, spec)
    app = App([spec])
    app.handler(spec.lane, cpu=True, time_limit_s=60)(cast("Handler", crunch))
    ran = tmp_path / "ran.txt"
    await produce(
        transport, spec.name, [Record(b"%s|%d" % (bytes(ran), n), b"hot") for n in range(60)]
    )
    settings = SMALL.model_copy(update={"cpu_workers": 1})
    assert isinstance(settings, RuntimeSettings)
    redis = Redis.from_url(redis_service)
    member = Member(app, transport, f"g-{unique}", settings, redis=redis, redis_prefix=f"t{unique}")
    try:
        async with running(member):
            await eventually(lambda: len(_numbers(ran)) >= 60, timeout_s=90)
    finally:
        await redis.aclose()
    assert _numbers(ran) == list(range(60))
    assert member.stats.deferred >= 1


async def test_a_hot_key_parked_by_a_failure_before_the_spill(
    transport: Transport, redis_service: str, unique: str
) -> None:
    """The hot key's first message fails at once: the key is parked when its backlog spills.

    Its followers, marked or not, are held behind it; its copy, due in the same key, runs
    first and releases them in order, each once.
    """
    spec = lane_spec(f"hotpark_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    app = App([spec])
    done: list[int] = []
    attempts: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        n = int(event.value.split(b":")[1])
        if n == 0:
            attempts.append(ctx.attempt)
            if ctx.attempt == 1:
                raise RuntimeError("flaky dependency")
        await asyncio.sleep(0.01)
        done.append(n)

    await produce(transport, spec.name, [Record(b"hot:%d" % n, b"hot") for n in range(80)])
    redis = Redis.from_url(redis_service)
    member = Member(app, transport, f"g-{unique}", SMALL, redis=redis, redis_prefix=f"t{unique}")
    try:
        async with running(member):
            await eventually(lambda: len(done) >= 80)
    finally:
        await redis.aclose()
    assert done == list(range(80))
    assert attempts == [1, 2]
