"""Long work: hung cpu=True handlers are killed and retried, cancelled ones leave no process."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis
from runtime import cpu_app
from runtime.helpers import eventually, lane_spec, running
from runtime.owned import Declare

from pipeline.cancel.functions import CancelFunctions, SyncBatch
from pipeline.cancel.keys import CancelKeys
from pipeline.cancel.reconcile import Reconciler
from pipeline.cancel.target import Selectors
from pipeline.config import RuntimeSettings
from pipeline.errors import ConfigError
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

QUICK = RuntimeSettings(
    commit_interval_ms=100, shutdown_grace_s=5.0, cancel_poll_ms=50, cancel_grace_s=0.5
)


@pytest.fixture
async def prefix(prefix: str, redis: Redis, unique: str) -> AsyncIterator[str]:
    """The shared prefix (tests/runtime/conftest.py); the workers' result sets are deleted too."""
    yield prefix
    await redis.delete(f"cpu-done:cpu_{unique}", f"cpu-done:warm_{unique}")


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float = 60.0) -> None:
    """Wait until ``await check()`` holds (re-checked every 20 ms); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"condition not met after {timeout_s}s"
        await asyncio.sleep(0.02)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that still runs (a zombie waiting to be reaped does not)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        state = stat.read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


async def test_a_hung_cpu_handler_is_killed_and_retried(
    transport: Transport, redis: Redis, prefix: str, unique: str, lanes: Declare
) -> None:
    """A worker that froze (no heartbeats past heartbeat_timeout) is killed; the retry runs."""
    # The frozen event is sent only once a warm-up event has started the one worker and
    # imported the handlers, so the frozen pid recorded is the one whose silence is judged.
    warm = lane_spec(f"warm_{unique}", 1)
    spec = lane_spec(
        f"cpu_{unique}", 1, ordered=False, retry={"tiers": ["200ms"]}, heartbeat_timeout="2s"
    )
    await lanes(warm, spec)
    app = App([warm, spec])
    app.handler(warm.lane, cpu=True, time_limit_s=120)(cpu_app.crunch)
    app.handler(spec.lane, cpu=True, time_limit_s=120)(cpu_app.stall)
    settings = QUICK.model_copy(update={"cpu_workers": 1})
    member = Member(app, transport, f"g-{unique}", settings, redis=redis, redis_prefix=prefix)
    producer = transport.producer()
    try:
        async with running(member):
            await producer.send(warm.name, b"warm")
            await eventually(lambda: member.stats.handled == 1, timeout_s=90)
            await producer.send(spec.name, b"frozen")
            await eventually(lambda: member.stats.handled == 2, timeout_s=90)
    finally:
        await producer.close()
    assert (member.stats.hung, member.stats.retried) == (1, 1)
    results = await redis.smembers(f"cpu-done:{spec.lane}")
    (pid,) = [int(r.split(b":")[1]) for r in results if r.startswith(b"pid:")]
    assert results - {f"pid:{pid}".encode()} == {b"frozen:2"}
    assert not _alive(pid)  # the frozen worker was killed
    counts = await redis.hgetall(CancelKeys(prefix).counts)
    assert counts == {f"{spec.lane}:hung".encode(): b"1"}
    assert await redis.hlen(CancelKeys(prefix).runs) == 0  # its runs ended and were removed


async def test_a_cancelled_subprocess_handler_leaves_no_process(
    transport: Transport, redis: Redis, prefix: str, unique: str, lanes: Declare
) -> None:
    """Cancelling a cpu=True handler stops its worker and the process the handler started."""
    spec = lane_spec(f"cpu_{unique}", 1, heartbeat_timeout="30s")
    await lanes(spec)
    app = App([spec])
    app.handler(spec.lane, cpu=True, time_limit_s=120)(cpu_app.spawn)
    producer = transport.producer()
    await producer.send(spec.name, b"job", key=b"doc-7")
    await producer.close()
    results = f"cpu-done:{spec.lane}"
    member = Member(app, transport, f"g-{unique}", QUICK, redis=redis, redis_prefix=prefix)
    async with running(member):
        pids: list[int] = []

        async def started() -> bool:
            found = [m for m in await redis.smembers(results) if m.startswith(b"pids:")]
            if found:
                pids.extend(int(p) for p in found[0].split(b":")[1:])
            return bool(found)

        await _until(started)
        assert all(_alive(pid) for pid in pids)
        told = await app.cancel(redis, key="doc-7", prefix=prefix)
        assert told == 1  # registered long work, told through Redis
        await eventually(lambda: member.stats.cancelled == 1)
    assert not any(_alive(pid) for pid in pids), pids
    assert b"finished" not in await redis.smembers(results)


async def test_a_cpu_handler_sees_ctx_cancelled_before_it_is_killed(
    transport: Transport, redis: Redis, prefix: str, unique: str, lanes: Declare
) -> None:
    """SIGTERM turns ctx.cancelled true in the worker: the handler stops itself, the worker goes."""
    spec = lane_spec(f"cpu_{unique}", 1, heartbeat_timeout="30s")
    await lanes(spec)
    app = App([spec])
    app.handler(spec.lane, cpu=True, time_limit_s=120)(cpu_app.patient)
    producer = transport.producer()
    await producer.send(spec.name, b"job", key=b"doc-8")
    await producer.close()
    results = f"cpu-done:{spec.lane}"
    settings = QUICK.model_copy(update={"cancel_grace_s": 30.0})  # it stops long before
    member = Member(app, transport, f"g-{unique}", settings, redis=redis, redis_prefix=prefix)
    async with running(member):
        pids: list[int] = []

        async def started() -> bool:
            found = [m for m in await redis.smembers(results) if m.startswith(b"pid:")]
            if found:
                pids.append(int(found[0].split(b":")[1]))
            return bool(found)

        await _until(started)
        await app.cancel(redis, key="doc-8", prefix=prefix)
        await eventually(lambda: member.stats.cancelled == 1)

        async def saw_cancel() -> bool:
            return b"saw-cancel" in await redis.smembers(results)

        await _until(saw_cancel)
    assert not _alive(pids[0])


async def test_a_heartbeat_that_lands_during_the_sweep_wins(redis: Redis, prefix: str) -> None:
    """A run picked as silent is left alone if a heartbeat arrives before the atomic re-check."""
    functions = CancelFunctions(redis, prefix)
    run, now = "lane_a/m1/1", int(time.time() * 1000)
    record = json.dumps({"lane": "lane_a", "member": "m1", "key": "k", "origin": now - 20_000})
    await functions.sync(now - 10_000, SyncBatch(begun={run: record}), [])
    reconciler = Reconciler(functions, {"lane_a": 1_000})
    assert await reconciler.candidates(Selectors(), now) == [run]
    await functions.sync(now, SyncBatch(beats={run: now}), [run])  # the late heartbeat
    assert await reconciler.settle(run, "lane_a", now) == "alive"
    _, stopping = await functions.sync(now, SyncBatch(), [run])
    assert stopping == {}
    # Silent for good: the next sweep stops it as hung, through the one transition.
    later = now + 1_500
    assert await reconciler.sweep(Selectors(), later) == {run: "hung"}
    _, stopping = await functions.sync(later, SyncBatch(), [run])
    assert stopping == {run: "hung"}
    assert await reconciler.sweep(Selectors(), later) == {run: "stopping"}


async def test_the_reconciler_stops_abandoned_and_upstream_cancelled_work(
    redis: Redis, prefix: str
) -> None:
    """Runs past pl-abandon-after-ms, or covered by a key cancelled upstream, are stopped."""
    functions = CancelFunctions(redis, prefix)
    now = int(time.time() * 1000)
    records = {
        "l/m/1": {"lane": "l", "member": "m", "key": "a", "origin": now - 50, "abandon": now - 1},
        "l/m/2": {"lane": "l", "member": "m", "key": "b", "origin": now - 50},
        "l/m/3": {"lane": "l", "member": "m", "key": "c", "origin": now - 50},
    }
    begun = {ident: json.dumps(rec) for ident, rec in records.items()}
    await functions.sync(now, SyncBatch(begun=begun), [])
    # Recorded as a selector only (the registered run is not told): the reconciler finds it.
    await redis.hset(
        CancelKeys(prefix).selectors,
        "key:*:b",
        json.dumps({"at": now, "reason": "upstream", "until": now + 60_000}),
    )
    version, entries = await functions.selectors()
    verdicts = await Reconciler(functions, {"l": 60_000}).sweep(Selectors(version, entries), now)
    assert verdicts == {"l/m/1": "abandoned", "l/m/2": "upstream"}


async def test_an_async_handler_that_stops_beating_is_hung_and_retried(
    transport: Transport, redis: Redis, prefix: str, unique: str, lanes: Declare
) -> None:
    """Once a handler beats on its own, falling silent past heartbeat_timeout makes it hung."""
    spec = lane_spec(f"beat_{unique}", 1, retry={"tiers": ["200ms"]}, heartbeat_timeout="1s")
    await lanes(spec)
    app = App([spec])
    attempts: list[int] = []
    stopped: list[bool] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        attempts.append(ctx.attempt)
        ctx.heartbeat()  # from now on only the handler's own beats count
        if ctx.attempt == 1:
            try:
                await asyncio.Event().wait()  # stuck on a dependency that never answers
            finally:
                stopped.append(ctx.cancelled)

    producer = transport.producer()
    await producer.send(spec.name, b"x", key=b"k")
    await producer.close()
    member = Member(app, transport, f"g-{unique}", QUICK, redis=redis, redis_prefix=prefix)
    async with running(member):
        await eventually(lambda: member.stats.handled == 1)
    assert attempts == [1, 2]
    assert stopped == [True]
    assert (member.stats.hung, member.stats.retried, member.stats.cancelled) == (1, 1, 0)


async def test_a_handler_that_keeps_beating_outlives_its_timeout(
    transport: Transport, redis: Redis, prefix: str, unique: str, lanes: Declare
) -> None:
    """Heartbeats racing the reconciler's sweeps keep a run alive past its heartbeat_timeout."""
    spec = lane_spec(f"alive_{unique}", 1, retry={"tiers": ["200ms"]}, heartbeat_timeout="2s")
    await lanes(spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        for _ in range(40):  # about 4 s of work, twice the timeout
            ctx.heartbeat()
            await asyncio.sleep(0.1)  # the handler's own work between beats

    producer = transport.producer()
    await producer.send(spec.name, b"long", key=b"k")
    await producer.close()
    member = Member(app, transport, f"g-{unique}", QUICK, redis=redis, redis_prefix=prefix)
    async with running(member):
        await eventually(lambda: member.stats.handled == 1)
    assert (member.stats.hung, member.stats.retried, member.stats.cancelled) == (0, 0, 0)


def test_a_heartbeat_timeout_under_two_ticks_is_refused(transport: Transport) -> None:
    """Heartbeats leave once a tick: a shorter timeout would let members stop healthy runs.

    ``heartbeat_timeout: 200ms`` with the default 500 ms tick was accepted, and every member's
    reconciler could find a run that beat on time silent and stop it as hung.
    """
    spec = lane_spec("beats_too_fast", 1, heartbeat_timeout="200ms")
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        """Never runs."""

    with pytest.raises(ConfigError, match=r"lane beats_too_fast: heartbeat_timeout \(200ms\)"):
        Member(app, transport, "g-never", RuntimeSettings())


async def test_a_cpu_run_waiting_for_a_busy_worker_is_not_hung(
    transport: Transport, redis: Redis, prefix: str, unique: str, lanes: Declare
) -> None:
    """A cpu=True run queued behind a busy worker past heartbeat_timeout is alive, not hung.

    The member beat for no cpu=True run while it waited for the pool to start or for a free
    worker, so the queued run was stopped as hung (and, with no retry tier, dead-lettered) before
    its handler ever began.
    """
    spec = lane_spec(f"cpu_{unique}", 1, ordered=False, heartbeat_timeout="2s")
    await lanes(spec)
    app = App([spec])
    app.handler(spec.lane, cpu=True, time_limit_s=120)(cpu_app.hold)
    settings = QUICK.model_copy(update={"cpu_workers": 1})
    member = Member(app, transport, f"g-{unique}", settings, redis=redis, redis_prefix=prefix)
    results = f"cpu-done:{spec.lane}"
    producer = transport.producer()
    try:
        async with running(member):
            await producer.send(spec.name, b"long:5", key=b"a")  # holds the one worker 5 s

            async def began() -> bool:
                return b"long:began" in await redis.smembers(results)

            await _until(began)
            await producer.send(spec.name, b"queued", key=b"b")  # waits for the worker
            await eventually(lambda: member.stats.handled == 2 or member.stats.hung > 0, 90)
    finally:
        await producer.close()
    assert (member.stats.hung, member.stats.dead_lettered, member.stats.handled) == (0, 0, 2)


async def test_a_cpu_run_on_a_short_heartbeat_timeout_is_not_hung(
    transport: Transport, redis: Redis, prefix: str, unique: str, lanes: Declare
) -> None:
    """A healthy cpu=True run on a lane whose heartbeat_timeout is under a second is not hung.

    Its worker beat once a second whatever the lane's timeout, so with ``500ms`` every healthy
    run fell silent for half a second between beats and was stopped as hung.
    """
    spec = lane_spec(f"cpu_{unique}", 1, heartbeat_timeout="500ms")
    await lanes(spec)
    app = App([spec])
    app.handler(spec.lane, cpu=True, time_limit_s=120)(cpu_app.hold)
    settings = QUICK.model_copy(update={"cpu_workers": 1})
    member = Member(app, transport, f"g-{unique}", settings, redis=redis, redis_prefix=prefix)
    producer = transport.producer()
    try:
        await producer.send(spec.name, b"busy:2", key=b"a")  # 2 s of work, four timeouts
        async with running(member):
            await eventually(lambda: member.stats.handled == 1 or member.stats.hung > 0, 90)
    finally:
        await producer.close()
    assert (member.stats.hung, member.stats.dead_lettered, member.stats.handled) == (0, 0, 1)
