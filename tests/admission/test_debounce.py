"""The coalescing debouncer on a real Redis: bursts, max wait, full buffers, members, retries."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from redis.asyncio import Redis
from runtime.helpers import eventually

from pipeline.admission.debounce import Debouncer, Turn
from pipeline.admission.debounce import keys as debounce_keys
from pipeline.admission.debounce.debouncer import Ending
from pipeline.admission.debounce.runner import TurnRunner
from pipeline.envelope import Message
from pipeline.topics.spec import DebouncePolicy

pytestmark = pytest.mark.redis
PREFIX = "pltest"


@pytest.fixture
async def redis(redis_service: str) -> AsyncIterator[Redis]:
    """A client of the shared test Redis."""
    client = Redis.from_url(redis_service)
    yield client
    await client.aclose()


@pytest.fixture
async def lane(redis: Redis, unique: str) -> AsyncIterator[str]:
    """A lane name no other test uses; its keys are deleted afterwards (buffers never expire)."""
    name = f"deb_{unique}"
    yield name
    async for key in redis.scan_iter(match=f"{debounce_keys.lane_tag(PREFIX, name)}*"):
        await redis.delete(key)


def policy(quiet_s: float = 0.2, max_wait_s: float = 5.0, max_batch: int = 100) -> DebouncePolicy:
    """A debounce policy with short test timings."""
    return DebouncePolicy(
        key="conversation_id", quiet_s=quiet_s, max_wait_s=max_wait_s, max_batch=max_batch
    )


def message(offset: int, text: str, key: bytes | None = b"k") -> Message:
    """A consumed message whose value is ``text``."""
    return Message(
        "chat", offset % 3, offset, key, text.encode(), {"tenant": b"acme"}, 1_000 + offset
    )


def texts(turn: Turn) -> list[str]:
    """The message values of a turn, in order."""
    return [m.value.decode() for m in turn.messages]


class Recorder:
    """A turn callback that keeps every turn it sees and checks a key's turns never overlap."""

    def __init__(self, outcome: Callable[[Turn], Awaitable[bool]] | None = None) -> None:
        """Succeed every turn, or return what ``outcome`` says."""
        self.turns: list[Turn] = []
        self.active: defaultdict[str, int] = defaultdict(int)
        self.overlaps = 0
        self._outcome = outcome

    async def __call__(self, turn: Turn) -> bool:
        """Record the turn (and let other tasks run while it is active)."""
        self.active[turn.key] += 1
        if self.active[turn.key] > 1:
            self.overlaps += 1
        try:
            self.turns.append(turn)
            await asyncio.sleep(0.005)  # simulated work: gives another runner a chance to overlap
            return True if self._outcome is None else await self._outcome(turn)
        finally:
            self.active[turn.key] -= 1

    def of(self, key: str) -> list[Turn]:
        """The turns of ``key``, in the order they ran."""
        return [t for t in self.turns if t.key == key]


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


async def test_burst_inside_quiet_period_gives_one_turn_with_every_message_in_order(redis, lane):
    """A burst of M messages inside the quiet period gives one turn holding all M in order.

    The runner claims while the burst is recorded; the quiet period (3 s) is long enough that a
    loaded machine's stall between two records does not end it (at 0.3 s, one did).
    """
    debouncer = Debouncer(redis, PREFIX, lane, policy(quiet_s=3.0))
    recorder = Recorder()
    async with running(TurnRunner(debouncer, recorder)):
        for i in range(8):
            await debouncer.record("conv-1", message(i, f"m{i}"))
        await eventually(lambda: recorder.turns)
    assert len(recorder.turns) == 1
    assert debouncer.stats.superseded == 7
    turn = recorder.turns[0]
    assert texts(turn) == [f"m{i}" for i in range(8)]
    assert turn.attempt == 1
    assert len(turn.arrivals_ms) == 8
    assert list(turn.arrivals_ms) == sorted(turn.arrivals_ms)
    assert max(turn.arrivals_ms) < turn.due_ms
    assert turn.messages[3].headers == {"tenant": b"acme"}
    assert turn.messages[3].offset == 3
    assert turn.messages[3].key == b"k"
    assert debouncer.stats.turns == 1
    assert debouncer.stats.messages_per_turn == {8: 1}


async def test_bursts_farther_apart_give_separate_turns(redis, lane):
    """A burst recorded after the previous burst's turn fired gets a turn of its own.

    Each burst is recorded while no runner claims, so a stall between two of its records (a
    loaded machine) cannot cut it: its turn runs once it is recorded.
    """
    debouncer = Debouncer(redis, PREFIX, lane, policy())
    recorder = Recorder()
    for burst in range(3):
        for i in range(3):
            await debouncer.record("conv-1", message(burst * 10 + i, f"b{burst}m{i}"))
        async with running(TurnRunner(debouncer, recorder)):
            await eventually(lambda n=burst + 1: len(recorder.turns) == n)
    assert [texts(t) for t in recorder.turns] == [[f"b{b}m{i}" for i in range(3)] for b in range(3)]


async def test_endless_chatter_gets_a_turn_at_the_max_wait(redis, lane):
    """Messages that never leave a quiet gap stop moving the due time once max_wait is reached."""
    debouncer = Debouncer(redis, PREFIX, lane, policy(quiet_s=0.2, max_wait_s=0.5))
    dues = [await debouncer.record("chatty", message(0, "m0"))]
    cap_ms = dues[0] - 200 + 500  # first arrival + max_wait (the first due is arrival + quiet)
    deadline = time.monotonic() + 30
    while dues[-1] != cap_ms and time.monotonic() < deadline:
        await asyncio.sleep(0.02)  # the chatter's pace, not a synchronisation
        dues.append(await debouncer.record("chatty", message(len(dues), f"m{len(dues)}")))
    for _ in range(3):  # more chatter no longer postpones the turn
        dues.append(await debouncer.record("chatty", message(len(dues), f"m{len(dues)}")))
    assert dues[-4:] == [cap_ms] * 4
    assert dues == sorted(dues)
    turns: list[Turn] = []
    while not turns:
        turns.extend((await debouncer.claim(10)).turns)
        await asyncio.sleep(0.02)
    assert turns[0].due_ms == cap_ms
    assert texts(turns[0]) == [f"m{i}" for i in range(len(dues))]


async def test_full_buffer_forces_a_turn(redis, lane):
    """max_batch buffered messages make the turn due at once; later ones wait for the next turn."""
    debouncer = Debouncer(redis, PREFIX, lane, policy(quiet_s=30.0, max_wait_s=60.0, max_batch=3))
    dues = [await debouncer.record("full", message(i, f"m{i}")) for i in range(4)]
    assert dues[2] < dues[1]  # the third message filled the buffer: due now, not in 30 s
    claim = await debouncer.claim(10)
    assert [texts(t) for t in claim.turns] == [["m0", "m1", "m2"]]
    assert await debouncer.finish(claim.turns[0], ok=True) == "scheduled"
    assert (await debouncer.claim(10)).turns == ()  # m3 waits for its own quiet period


async def test_four_runners_give_one_turn_per_burst_in_order_without_overlap(redis, lane, settings):
    """Four members on a lane: one turn per burst, in order, and a key's turns never overlap.

    The runners claim while the bursts are recorded; the quiet period (3 s) is long enough that
    a loaded machine's stall between two records of a key's burst does not cut it in two.
    """
    clients = [Redis.from_url(settings.redis.url) for _ in range(4)]
    debouncers = [Debouncer(c, PREFIX, lane, policy(quiet_s=3.0)) for c in clients]
    recorder = Recorder()
    runners = [TurnRunner(d, recorder, max_concurrency=4) for d in debouncers]
    keys = [f"conv-{i}" for i in range(40)]
    sent: dict[str, list[str]] = defaultdict(list)
    try:
        async with running(*runners):
            for burst in range(2):
                for n, key in enumerate(keys):
                    for i in range(1 + (n + burst) % 5):
                        text = f"{key}/b{burst}/m{i}"
                        sent[key].append(text)
                        member = debouncers[(n + i) % 4]  # a burst's messages reach several members
                        await member.record(key, message(len(sent[key]), text))
                await eventually(lambda n=burst + 1: all(len(recorder.of(k)) >= n for k in keys))
    finally:
        for c in clients:
            await c.aclose()
    assert recorder.overlaps == 0
    for key in keys:
        turns = recorder.of(key)
        assert len(turns) == 2, key
        assert [m for t in turns for m in texts(t)] == sent[key]
        assert all(text.split("/")[1] == "b0" for text in texts(turns[0]))
    assert sum(d.stats.turns for d in debouncers) == 2 * len(keys)


async def test_message_during_a_running_turn_lands_in_the_next_turn(redis, lane):
    """A message recorded while its key's turn runs is not in that turn but in the next one."""
    debouncer = Debouncer(redis, PREFIX, lane, policy(quiet_s=0.1))
    release = asyncio.Event()

    async def hold_first(turn: Turn) -> bool:
        if texts(turn)[0] == "m0":
            await release.wait()
        return True

    recorder = Recorder(hold_first)
    # m0 and m1 are recorded before the runner claims: a stall between them cannot cut them.
    await debouncer.record("conv", message(0, "m0"))
    await debouncer.record("conv", message(1, "m1"))
    async with running(TurnRunner(debouncer, recorder)):
        await eventually(lambda: recorder.turns)
        await debouncer.record("conv", message(2, "m2"))
        release.set()
        await eventually(lambda: len(recorder.turns) == 2)
    assert [texts(t) for t in recorder.turns] == [["m0", "m1"], ["m2"]]
    assert recorder.overlaps == 0


async def test_failed_turn_keeps_its_messages_and_runs_again_with_a_higher_attempt(redis, lane):
    """A callback that fails (False, then an exception) keeps the messages for a later attempt."""
    debouncer = Debouncer(redis, PREFIX, lane, policy(quiet_s=0.05))

    async def fail_twice(turn: Turn) -> bool:
        if turn.attempt == 1:
            return False
        if turn.attempt == 2:
            raise RuntimeError("handler broke")
        return True

    recorder = Recorder(fail_twice)
    runner = TurnRunner(debouncer, recorder, backoff=lambda attempt: 50 * attempt)
    for i in range(3):  # before the runner claims: a stall between two records cannot cut them
        await debouncer.record("flaky", message(i, f"m{i}"))
    async with running(runner):
        await eventually(lambda: len(recorder.turns) == 3)
        await eventually(lambda: runner.running == 0)
    assert [t.attempt for t in recorder.turns] == [1, 2, 3]
    assert all(texts(t) == ["m0", "m1", "m2"] for t in recorder.turns)
    assert debouncer.stats.failed_turns == 2
    assert await redis.exists(debounce_keys.buffer_key(PREFIX, lane, "flaky")) == 0


async def test_a_turn_carries_the_time_of_its_first_failure_until_it_succeeds(redis, lane):
    """Each retry of a failed turn says when its first run failed; a turn after a success, none.

    Before, the debouncer kept no failure time, so a turn dead-lettered after several runs could
    only give its last run's time as its first failure.
    """
    debouncer = Debouncer(redis, PREFIX, lane, policy(quiet_s=0.05))

    async def claim_one() -> Turn:
        while True:
            turns = (await debouncer.claim(1)).turns
            if turns:
                return turns[0]
            await asyncio.sleep(0.02)

    async def fail(turn: Turn) -> int:
        step = await debouncer.step(0, [Ending(turn.key, turn.token, ok=False, retry_in_ms=0)])
        assert step.outcomes == ("scheduled",)
        return step.now_ms

    await debouncer.record("conv", message(0, "m0"))
    first = await asyncio.wait_for(claim_one(), 30)
    assert first.first_failure_ms is None
    failed_ms = await fail(first)
    second = await asyncio.wait_for(claim_one(), 30)
    await fail(second)
    third = await asyncio.wait_for(claim_one(), 30)
    assert [t.attempt for t in (first, second, third)] == [1, 2, 3]
    assert second.first_failure_ms == third.first_failure_ms == failed_ms
    assert await debouncer.finish(third, ok=True) == "done"
    await debouncer.record("conv", message(1, "m1"))
    after = await asyncio.wait_for(claim_one(), 30)
    assert (after.attempt, after.first_failure_ms) == (1, None)
    assert await debouncer.finish(after, ok=True) == "done"


async def test_expired_lease_is_claimed_again_and_the_old_holder_cannot_finish(redis, lane):
    """An expired lease is claimed again (attempt 2); the old holder's finish changes nothing."""
    debouncer = Debouncer(redis, PREFIX, lane, policy(quiet_s=0.05), lease_ms=150)
    await debouncer.record("conv", message(0, "m0"))
    claimed: list[Turn] = []

    async def claim_one() -> None:
        while not claimed:
            claimed.extend((await debouncer.claim(1)).turns)
            await asyncio.sleep(0.02)

    await asyncio.wait_for(claim_one(), 30)
    first = claimed.pop()
    await asyncio.wait_for(claim_one(), 30)
    second = claimed.pop()
    assert (first.attempt, second.attempt) == (1, 2)
    assert texts(second) == ["m0"]
    assert await debouncer.finish(first, ok=True) == "lost"
    assert debouncer.stats.lost_leases == 1
    assert await debouncer.finish(second, ok=True) == "done"


async def test_idle_conversation_leaves_only_an_expiring_state_key(redis, lane):
    """Once a key's turn is done its buffer and due entry are gone and its state key expires."""
    debouncer = Debouncer(redis, PREFIX, lane, policy(quiet_s=0.05), idle_ttl_ms=60_000)
    recorder = Recorder()
    runner = TurnRunner(debouncer, recorder)
    async with running(runner):
        await debouncer.record("conv", message(0, "m0"))
        await eventually(lambda: recorder.turns)
        await eventually(lambda: runner.running == 0)
    assert await redis.exists(debounce_keys.due_key(PREFIX, lane)) == 0
    assert await redis.exists(debounce_keys.buffer_key(PREFIX, lane, "conv")) == 0
    ttl_ms = await redis.pttl(debounce_keys.state_key(PREFIX, lane, "conv"))
    assert 0 < ttl_ms <= 60_000
    assert await debouncer.next_due_ms() is None


async def test_idle_runner_makes_at_most_one_call_per_poll_interval(redis, lane):
    """An idle runner makes no more than one Redis call per poll interval, whatever it waits."""
    debouncer = Debouncer(redis, PREFIX, lane, policy())
    runner = TurnRunner(debouncer, Recorder(), poll_interval_ms=50)
    started = time.monotonic()
    async with running(runner):
        await eventually(lambda: debouncer.stats.redis_calls >= 6)
    elapsed_s = time.monotonic() - started
    # A sleep never ends early, so calls are bounded by elapsed time / interval (+ load, + 1st).
    assert debouncer.stats.redis_calls <= elapsed_s / 0.05 + 3
    assert debouncer.stats.turns == 0


async def test_local_record_of_an_earlier_due_time_wakes_the_runner(redis, lane):
    """A runner with a long poll interval still fires a turn recorded by its own process."""
    debouncer = Debouncer(redis, PREFIX, lane, policy(quiet_s=0.05))
    recorder = Recorder()
    runner = TurnRunner(debouncer, recorder, poll_interval_ms=600_000)
    async with running(runner):
        await eventually(lambda: debouncer.stats.redis_calls >= 1)  # its first claim: now asleep
        await debouncer.record("conv", message(0, "m0"))
        await eventually(lambda: recorder.turns, timeout_s=30)
    assert texts(recorder.turns[0]) == ["m0"]


async def test_a_redelivered_message_is_not_buffered_twice(redis, lane):
    """The same message recorded again (redelivered, or a retried call) is in its turn once.

    Before, a member killed after ``record`` but before its commit had the message read again
    by the next owner and recorded twice, so the turn held it twice. A message at a lower offset
    but produced later (its topic created anew) is still a new message, and so is an older
    offset recorded after a newer one (two message keys of one conversation run side by side).
    """
    debouncer = Debouncer(redis, PREFIX, lane, policy(quiet_s=30.0, max_wait_s=60.0, max_batch=4))
    for offset in (3, 4, 3, 4):  # two, then both again as a new owner reads them
        await debouncer.record("again", message(offset, f"m{offset}"))
    assert debouncer.stats.repeated == 2
    assert debouncer.stats.recorded == 2
    anew = Message("chat", 0, 0, b"k", b"anew", {}, 1_000 + 99)  # offset 0, produced later
    assert await debouncer.record("again", anew) > 0
    assert await debouncer.record("again", message(1, "m1")) > 0  # max_batch: due at once
    claim = await debouncer.claim(10)
    assert [texts(t) for t in claim.turns] == [["m3", "m4", "anew", "m1"]]


async def test_a_conversation_key_with_a_lone_surrogate_is_debounced(redis, lane):
    """A conversation key holding a lone surrogate (half a pair escaped in JSON) gets its turn."""
    debouncer = Debouncer(redis, PREFIX, lane, policy(quiet_s=0.05))
    recorder = Recorder()
    # Both recorded before the runner claims: a stall between them cannot cut them in two.
    await debouncer.record("conv-\ud800", message(0, "m0"))
    await debouncer.record("conv-\ud800", message(1, "m1"))
    async with running(TurnRunner(debouncer, recorder)):
        await eventually(lambda: recorder.turns)
    assert [(t.key, texts(t)) for t in recorder.turns] == [("conv-\ufffd", ["m0", "m1"])]
