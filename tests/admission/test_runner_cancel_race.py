"""A debounced lane's turn runner, cancelled, cancels the turns it runs and ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from pipeline.admission.debounce import Debouncer, Turn
from pipeline.admission.debounce import keys as debounce_keys
from pipeline.admission.debounce.runner import TurnRunner
from pipeline.envelope import Message
from pipeline.topics.spec import DebouncePolicy

pytestmark = pytest.mark.redis
PREFIX = "pltest"


@pytest.fixture
async def lane(redis: Redis, unique: str) -> AsyncIterator[str]:
    """A lane name no other test uses; its keys are deleted afterwards (buffers never expire)."""
    name = f"debcancel_{unique}"
    yield name
    async for key in redis.scan_iter(match=f"{debounce_keys.lane_tag(PREFIX, name)}*"):
        await redis.delete(key)


class Blocking:
    """A turn callback that runs until it is cancelled, and says so."""

    def __init__(self) -> None:
        """No turn started yet."""
        self.started = asyncio.Event()
        self.cancelled = 0

    async def __call__(self, turn: Turn) -> bool:  # noqa: ARG002
        """Wait for ever (a handler still going when the member's grace ends)."""
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return True


def _debouncer(redis: Redis, lane: str) -> Debouncer:
    policy = DebouncePolicy(key="conversation_id", quiet_s=0.05, max_wait_s=5.0, max_batch=10)
    return Debouncer(redis, PREFIX, lane, policy)


def _message() -> Message:
    return Message("chat", 0, 0, b"k", b"hello", {}, 1_000)


async def test_a_runner_cancelled_while_a_turn_runs_cancels_the_turn(
    redis: Redis, lane: str
) -> None:
    """At the end of the member's grace the runner is cancelled: its running turn is too.

    Before, the runner's cancellation only ended its loop: it then waited for the running turns
    without cancelling them, so a turn that would have stopped ran on, the runner never ended,
    and the member waited ``cancel_grace_s`` + 5 s more, then said the turn ignored its
    cancellation.
    """
    debouncer = _debouncer(redis, lane)
    blocking = Blocking()
    runner = TurnRunner(debouncer, blocking)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    await debouncer.record("conv", _message())
    await blocking.started.wait()
    stop.set()  # the member's stop: the runner waits for its running turn to end
    task.cancel()  # the grace ended
    done, _ = await asyncio.wait({task}, timeout=30)  # the failure mode is a runner that hangs
    if not done:
        task.cancel()  # a second cancellation reaches the turn through the gather
        await asyncio.wait({task})
    assert done
    assert task.cancelled()
    assert blocking.cancelled == 1
    assert runner.running == 0


class _CancelledWhenWoken(asyncio.Event):
    """The runner's wake-up event; once armed, its runner is cancelled in the turn it wakes.

    With ``at_once``, a wait begun after ``stop`` is set is woken as it starts (a turn of the
    runner's ending meanwhile, say).
    """

    def __init__(self, stop: asyncio.Event, *, at_once: bool) -> None:
        """Unarmed: an ordinary event."""
        super().__init__()
        self.stop = stop
        self.at_once = at_once
        self.armed: asyncio.Task[None] | None = None

    async def wait(self) -> bool:  # type: ignore[override]
        """Wait as the event does; once armed, cancel the runner as the wait's result comes."""
        if self.armed is not None and self.at_once and self.stop.is_set():
            self.set()
        woken = await super().wait()
        task, self.armed = self.armed, None
        if task is not None:
            task.cancel()
        return woken


async def _cancelled_when_woken(redis: Redis, lane: str, *, draining: bool) -> None:
    debouncer = _debouncer(redis, lane)
    blocking = Blocking()
    runner = TurnRunner(debouncer, blocking)
    stop = asyncio.Event()
    wake = _CancelledWhenWoken(stop, at_once=draining)
    runner._wake = wake
    task = asyncio.create_task(runner.run(stop))
    await debouncer.record("conv", _message())
    await blocking.started.wait()
    if draining:
        stop.set()  # the runner waits for its running turn to end, and is woken then
        wake.armed = task
    else:
        wake.armed = task
        stop.set()  # the runner wakes to stop, and its cancellation comes with it
    done, _ = await asyncio.wait({task}, timeout=30)  # the failure mode is a runner that hangs
    if not done:
        task.cancel()  # a second cancellation reaches the turn through the gather
        await asyncio.wait({task})
    assert done
    assert task.cancelled()
    assert blocking.cancelled == 1


async def test_a_runner_cancelled_as_it_wakes_to_stop_cancels_the_turn(
    redis: Redis, lane: str
) -> None:
    """A runner cancelled in the loop turn in which its stop wakes it still cancels its turn.

    It waited for a wake-up under ``asyncio.wait_for``, which on Python 3.11 returns and drops a
    cancellation that lands once the awaited thing is done (CPython issue 86296); a member whose
    grace was cut short (a second signal) cancels its runners right after it stops them.
    """
    await _cancelled_when_woken(redis, lane, draining=False)


async def test_a_runner_cancelled_as_it_is_woken_while_draining_cancels_the_turn(
    redis: Redis, lane: str
) -> None:
    """A stopped runner cancelled in the loop turn in which it is woken still cancels its turn.

    Its wait for its running turns to end was under ``asyncio.wait_for`` too (CPython issue
    86296): the member's cancellation at the end of its grace could be lost there.
    """
    await _cancelled_when_woken(redis, lane, draining=True)
