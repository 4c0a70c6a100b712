"""The debouncer's runners are woken by Redis, not polling: wake-ups, idle cost, timer hand-off.

Calls are counted on the wire: every client here uses a connection class that counts the
commands it sends, and the blocking reads go through connections of the same class.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import pytest
from redis.asyncio import Connection, Redis
from runtime.helpers import eventually

from pipeline.admission.debounce import Debouncer, Turn, TurnRunner
from pipeline.admission.debounce import keys as debounce_keys
from pipeline.admission.debounce.debouncer import GRACE_MS
from pipeline.envelope import Message
from pipeline.topics.spec import DebouncePolicy

pytestmark = pytest.mark.redis
PREFIX = "pltest"
POLICY = DebouncePolicy(key="conversation_id", quiet_s=0.05, max_wait_s=5.0, max_batch=100)
NEVER_MS = 3_600_000  # a watchdog interval no test outlives: only wake-ups can start a turn
PATIENT = POLICY.model_copy(update={"quiet_s": 3.0})
"""Quiet long enough that a loaded machine's stall between two records a test makes one after
the other, while a runner waits, does not let the first one's turn fall due before the second."""


class CountingConnection(Connection):
    """A real connection that keeps the name of every command it sends (shared by all clients)."""

    sent: ClassVar[list[str]] = []

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """Note the command's name, then send it."""
        first = bytes(command[0] if isinstance(command, list) else command)
        CountingConnection.sent.append(first.split(b"\r\n")[2].decode())
        await super().send_packed_command(command, check_health)


@pytest.fixture
async def lane(redis: Redis, unique: str) -> AsyncIterator[str]:
    """A lane no other test uses; its keys are deleted afterwards."""
    name = f"deb_{unique}"
    yield name
    async for key in redis.scan_iter(match=f"{debounce_keys.lane_tag(PREFIX, name)}*"):
        await redis.delete(key)


@asynccontextmanager
async def members(url: str, count: int) -> AsyncIterator[list[Redis]]:
    """``count`` counting clients, one per simulated member process."""
    CountingConnection.sent.clear()
    clients = [Redis.from_url(url, connection_class=CountingConnection) for _ in range(count)]
    try:
        yield clients
    finally:
        for client in clients:
            await client.aclose()


@asynccontextmanager
async def running(*runners: TurnRunner) -> AsyncIterator[None]:
    """Run the runners in the background; stop them on exit."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(r.run(stop)) for r in runners]
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)


def message(offset: int) -> Message:
    """A consumed message whose value is ``m<offset>``."""
    return Message("chat", 0, offset, b"k", f"m{offset}".encode())


class Keep:
    """A turn callback that keeps every turn."""

    def __init__(self) -> None:
        """Start with no turns."""
        self.turns: list[Turn] = []

    async def __call__(self, turn: Turn) -> bool:
        """Keep the turn; it succeeds."""
        self.turns.append(turn)
        return True


async def blocked(*debouncers: Debouncer) -> None:
    """Wait until each runner sent its first step and its blocking read."""
    sent = CountingConnection.sent
    await eventually(lambda: all(d.stats.steps for d in debouncers))
    await eventually(lambda: sent.count("BLPOP") >= len(debouncers))
    await eventually(lambda: sent.count("FCALL") >= len(debouncers))


async def test_idle_lane_with_three_runners_sends_no_command(redis_service, lane):
    """Three runners on an idle lane, once blocked, send nothing at all while it stays idle."""
    async with members(redis_service, 3) as clients:
        debouncers = [Debouncer(c, PREFIX, lane, POLICY) for c in clients]
        runners = [TurnRunner(d, Keep(), poll_interval_ms=NEVER_MS) for d in debouncers]
        async with running(*runners):
            await blocked(*debouncers)
            before = len(CountingConnection.sent), [d.stats.redis_calls for d in debouncers]
            await asyncio.sleep(1.0)  # the idle period measured, not a synchronisation
            after = len(CountingConnection.sent), [d.stats.redis_calls for d in debouncers]
    assert after == before, CountingConnection.sent[before[0] :]
    assert all(d.stats.turns == 0 for d in debouncers)


async def test_record_in_another_process_wakes_a_blocked_runner(redis_service, lane):
    """A record by another member wakes a blocked runner through the wake list; the turn runs."""
    async with members(redis_service, 2) as (producer, member):
        recorder = Debouncer(producer, PREFIX, lane, PATIENT)  # no runner: no local wake-up
        debouncer = Debouncer(member, PREFIX, lane, PATIENT)
        keep = Keep()
        async with running(TurnRunner(debouncer, keep, poll_interval_ms=NEVER_MS)):
            await blocked(debouncer)
            for i in range(3):
                await recorder.record("conv", message(i))
            await eventually(lambda: keep.turns)
            await eventually(lambda: debouncer.stats.steps >= 3)  # the finish reached Redis
        assert [m.value for m in keep.turns[0].messages] == [b"m0", b"m1", b"m2"]
        assert debouncer.stats.wakeups >= 1
        assert recorder.stats.redis_calls == 3  # the wake-up rode on the records' own calls
        assert await recorder.next_due_ms() is None


async def test_runner_holds_the_timer_for_the_next_turn_without_a_wake_up(redis_service, lane):
    """After a step the runner holds the lane's next due time: a later turn needs no wake-up."""
    async with members(redis_service, 2) as (producer, member):
        recorder = Debouncer(producer, PREFIX, lane, PATIENT)
        debouncer = Debouncer(member, PREFIX, lane, PATIENT)
        keep = Keep()
        async with running(TurnRunner(debouncer, keep, poll_interval_ms=NEVER_MS)):
            await blocked(debouncer)
            await recorder.record("first", message(0))  # wakes the runner: it arms a timer
            await recorder.record("second", message(1))  # due later than the armed timer
            await eventually(lambda: len(keep.turns) == 2)
        assert sorted(t.key for t in keep.turns) == ["first", "second"]
        assert debouncer.stats.wakeups == 1


async def test_full_runner_hands_its_timer_to_a_free_one(redis_service, lane):
    """A runner with no free slot when its timer fires hands the turn to another runner."""
    release = asyncio.Event()
    ran: dict[str, int] = {}

    def holding(index: int) -> Callable[[Turn], Awaitable[bool]]:
        async def run(turn: Turn) -> bool:
            ran[turn.key] = index
            if turn.key == "hold":
                await release.wait()
            return True

        return run

    async with members(redis_service, 3) as (producer, *clients):
        recorder = Debouncer(producer, PREFIX, lane, POLICY)
        # "next" falls due well after the runner that took "hold" has gone back to sleep
        later = Debouncer(producer, PREFIX, lane, POLICY.model_copy(update={"quiet_s": 0.3}))
        debouncers = [Debouncer(c, PREFIX, lane, POLICY) for c in clients]
        runners = [
            TurnRunner(d, holding(i), max_concurrency=1, poll_interval_ms=NEVER_MS)
            for i, d in enumerate(debouncers)
        ]
        async with running(*runners):
            try:
                await blocked(*debouncers)
                await recorder.record("hold", message(0))  # one wake-up: one runner takes both
                await later.record("next", message(1))  # due after it: no wake-up of its own
                await eventually(lambda: "next" in ran)
            finally:
                release.set()  # the held turn ends either way, so the runners can stop
        assert ran["next"] != ran["hold"]
        assert sum(d.stats.wakeups for d in debouncers) == 2  # the record's, the hand-over's


async def test_a_busy_step_passes_the_timer_to_the_next_blocked_runner(redis, lane):
    """A step that leases pass_at turns or more puts the next due time on the wake list."""
    due_now = Debouncer(redis, PREFIX, lane, POLICY.model_copy(update={"max_batch": 1}))
    later = Debouncer(redis, PREFIX, lane, POLICY.model_copy(update={"quiet_s": 30.0}))
    for key in ("a", "b"):
        await due_now.record(key, message(0))  # a full buffer: due at once
    c_due = await later.record("c", message(1))
    await redis.delete(debounce_keys.wake_key(PREFIX, lane))  # the records' own wake-ups
    busy = await due_now.step(10, pass_at=2)
    assert sorted(t.key for t in busy.turns) == ["a", "b"]
    assert busy.timer_ms is None  # passed on, not taken
    assert await redis.lrange(debounce_keys.wake_key(PREFIX, lane), 0, -1) == [str(c_due).encode()]
    calm = await later.step(10, pass_at=2)  # nothing due: the caller takes the timer
    assert (calm.turns, calm.timer_ms) == ((), c_due)


async def test_a_handed_over_timer_is_kept_by_a_runner_that_steps_early(redis, lane):
    """The runner a full one hands its timer to takes it even when it steps before the due time.

    Its clock offset from Redis is an estimate, so its timer can fire a little early: the step
    then leases nothing, and the timer must still be its own (the full runner gave it up).
    """
    due_now = Debouncer(redis, PREFIX, lane, POLICY.model_copy(update={"max_batch": 1}))
    later = Debouncer(redis, PREFIX, lane, POLICY.model_copy(update={"quiet_s": 30.0}))
    await due_now.record("hold", message(0))  # a full buffer: due at once
    c_due = await later.record("c", message(1))
    full = await due_now.step(1)  # leases "hold" and takes the timer for "c"
    assert ([t.key for t in full.turns], full.timer_ms) == (["hold"], c_due)
    await redis.delete(debounce_keys.wake_key(PREFIX, lane))  # the records' own wake-ups
    await due_now.wake(c_due)  # no free slot when its timer fires: handed over
    woken = await later.step(1)  # the woken runner steps early: nothing due yet
    assert (woken.turns, woken.timer_ms) == ((), c_due)


async def test_a_step_told_of_another_holder_returns_when_its_hold_expires(redis, lane):
    """A step that leases nothing while another runner holds the timer gets that hold's expiry.

    That is when its runner steps again, in case the holder died; the holder itself, and a
    runner that takes the timer, get none.
    """
    later = Debouncer(redis, PREFIX, lane, POLICY.model_copy(update={"quiet_s": 30.0}))
    other = Debouncer(redis, PREFIX, lane, POLICY)
    c_due = await later.record("c", message(0))
    held = await later.step(1)  # nothing due: takes the timer for "c"
    assert (held.turns, held.timer_ms, held.backup_ms) == ((), c_due, None)
    told = await other.step(1)
    assert (told.turns, told.timer_ms) == ((), None)
    assert told.backup_ms == await redis.pexpiretime(debounce_keys.armed_key(PREFIX, lane))
    assert told.backup_ms is not None
    assert told.backup_ms >= c_due + GRACE_MS  # a grace period after the held due time
    again = await later.step(1)  # the holder keeps its timer and is told of no one
    assert (again.timer_ms, again.backup_ms) == (c_due, None)


async def test_a_live_holder_and_a_backup_runner_run_each_turn_once(redis_service, lane):
    """A runner told that a live runner holds the timer steps when each hold expires: no turn twice.

    The turns fall due one after another, with no wake-up: the holder's timer fires for each,
    and the other runner, told by its first step that the holder holds the timer, steps again
    at each hold's expiry and finds the holder holding the next (or, if the holder was late,
    runs the turn itself). Either way every turn runs exactly once, on its first attempt.
    """
    count = 5
    async with members(redis_service, 3) as (producer, *clients):
        dues = []
        for i in range(count):  # due 2.0, 2.3, ... 3.2 s from now
            spaced = Debouncer(
                producer, PREFIX, lane, POLICY.model_copy(update={"quiet_s": 2 + i * 0.3})
            )
            dues.append(await spaced.record(f"c{i}", message(i)))
        await producer.delete(debounce_keys.wake_key(PREFIX, lane))  # only timers start turns
        holder, backup = (Debouncer(c, PREFIX, lane, POLICY) for c in clients)
        assert (await holder.step(1)).timer_ms == dues[0]  # the holder holds the timer for c0
        keep = Keep()
        runners = [TurnRunner(d, keep, poll_interval_ms=NEVER_MS) for d in (holder, backup)]
        async with running(*runners):
            await eventually(lambda: backup.stats.steps >= 2, 20)  # told, then stepped again
            await eventually(lambda: len(keep.turns) >= count)
        assert await producer.zcard(debounce_keys.due_key(PREFIX, lane)) == 0  # all finished
    assert sorted(t.key for t in keep.turns) == [f"c{i}" for i in range(count)]
    assert [t.attempt for t in keep.turns] == [1] * count
    assert holder.stats.wakeups + backup.stats.wakeups == 0  # timers and backups only
    assert holder.stats.lost_leases + backup.stats.lost_leases == 0
