"""The debouncer under faults: a member killed holding a turn, and Redis going away."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from ingress.redis_server import RedisServer
from redis.asyncio import Redis
from runtime.helpers import eventually

from pipeline.admission.debounce import Debouncer, Turn
from pipeline.admission.debounce import keys as debounce_keys
from pipeline.admission.debounce.functions import Ending, Leased
from pipeline.admission.debounce.runner import TurnRunner
from pipeline.envelope import Message
from pipeline.errors import DebounceUnavailable
from pipeline.topics.spec import DebouncePolicy

pytestmark = pytest.mark.redis
PREFIX = "pltest"
POLICY = DebouncePolicy(key="conversation_id", quiet_s=0.1, max_wait_s=5.0, max_batch=100)
WATCHDOG_MS = 60_000  # far beyond TAKEOVER_BOUND_S: a watchdog claim cannot run the turn
TAKEOVER_BOUND_S = 20.0  # generous against lease + grace (2 s) on a loaded machine

# A member that claims the lane's turns and hangs in its callback until it is killed.
MEMBER = textwrap.dedent(
    """
    import asyncio, sys
    from redis.asyncio import Redis
    from pipeline.admission.debounce import Debouncer
    from pipeline.admission.debounce.runner import TurnRunner
    from pipeline.topics.spec import DebouncePolicy

    async def main(url, lane):
        policy = DebouncePolicy(key="c", quiet_s=0.1, max_wait_s=5.0)
        debouncer = Debouncer(Redis.from_url(url), "pltest", lane, policy, lease_ms=1000)

        async def hang(turn):
            print("claimed", turn.key, len(turn.messages), flush=True)
            await asyncio.Event().wait()
            return True

        await TurnRunner(debouncer, hang).run(asyncio.Event())

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


def message(offset: int) -> Message:
    """A consumed message whose value is ``m<offset>``."""
    return Message("chat", 0, offset, b"k", f"m{offset}".encode())


@asynccontextmanager
async def running(runner: TurnRunner) -> AsyncIterator[None]:
    """Run ``runner`` in the background; stop it on exit."""
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_turn_of_a_member_killed_after_claiming_still_fires(redis_service, unique):
    """A member killed with SIGKILL while holding a turn: another member runs it after the lease.

    The killed member held the lane's timer (for its own lease's expiry). The runner started
    afterwards is told so by its first step and steps again when that hold expires in Redis
    (a grace period after the lease): it runs the turn then, not at its watchdog, which is
    set far beyond the wait allowed here.
    """
    lane = f"deb_{unique}"
    client = Redis.from_url(redis_service)
    debouncer = Debouncer(client, PREFIX, lane, POLICY, lease_ms=1000)
    for i in range(3):
        await debouncer.record("conv", message(i))
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", MEMBER, redis_service, lane, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        assert line.split() == [b"claimed", b"conv", b"3"]
    finally:
        os.kill(child.pid, signal.SIGKILL)
        await child.wait()
    turns: list[Turn] = []

    async def keep(turn: Turn) -> bool:
        turns.append(turn)
        return True

    try:
        async with running(TurnRunner(debouncer, keep, poll_interval_ms=WATCHDOG_MS)):
            try:  # due at the lease's end (1 s), run a grace period (1 s) later
                await asyncio.wait_for(eventually(lambda: turns), TAKEOVER_BOUND_S)
            except TimeoutError:
                pytest.fail(f"the dead member's turn did not run within {TAKEOVER_BOUND_S} s")
    finally:
        async for key in client.scan_iter(match=f"{debounce_keys.lane_tag(PREFIX, lane)}*"):
            await client.delete(key)
        await client.aclose()
    assert [m.value for m in turns[0].messages] == [b"m0", b"m1", b"m2"]
    assert turns[0].attempt == 2  # the killed member's run counts as an attempt


async def test_runner_killed_mid_turn_loses_nothing_to_a_runner_already_waiting(
    redis_service, unique
):
    """A member killed mid-turn while another waits blocked: every message still runs, once.

    The killed member held the lane's timer; no record wakes the waiting runner, so its
    watchdog, or its backup step when the killed member's hold of the timer expires, claims the
    turn once the lease has run out. A message recorded while the dead turn held the key runs
    in the next turn.
    """
    lane = f"deb_{unique}"
    client = Redis.from_url(redis_service)
    recorder = Debouncer(client, PREFIX, lane, POLICY, lease_ms=1000)
    survivor = Debouncer(Redis.from_url(redis_service), PREFIX, lane, POLICY, lease_ms=1000)
    turns: list[Turn] = []

    async def keep(turn: Turn) -> bool:
        turns.append(turn)
        return True

    for i in range(3):  # before the member claims: a stall between two cannot cut them
        await recorder.record("conv", message(i))
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", MEMBER, redis_service, lane, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        assert line.split() == [b"claimed", b"conv", b"3"]
        async with running(TurnRunner(survivor, keep, poll_interval_ms=1500)):
            await eventually(lambda: survivor.stats.steps >= 1)
            await recorder.record("conv", message(3))  # lands behind the dead member's lease
            os.kill(child.pid, signal.SIGKILL)
            await child.wait()
            await eventually(lambda: len(turns) >= 1)
            await eventually(lambda: [m for t in turns for m in t.messages][-1].offset == 3)
    finally:
        if child.returncode is None:
            os.kill(child.pid, signal.SIGKILL)
            await child.wait()
        async for key in client.scan_iter(match=f"{debounce_keys.lane_tag(PREFIX, lane)}*"):
            await client.delete(key)
        await client.aclose()
        await survivor.functions.client.aclose()
    assert [m.value for t in turns for m in t.messages] == [b"m0", b"m1", b"m2", b"m3"]
    assert turns[0].attempt == 2  # the killed member's run counts as an attempt


async def test_redis_down_fails_open_and_buffered_messages_survive_a_restart(tmp_path, unique):
    """With Redis stopped, record raises DebounceUnavailable; after a restart turns fire again."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    client = Redis.from_url(server.url, socket_connect_timeout=1, socket_timeout=1)
    debouncer = Debouncer(client, PREFIX, f"deb_{unique}", POLICY)
    turns: list[Turn] = []

    async def keep(turn: Turn) -> bool:
        turns.append(turn)
        return True

    runner = TurnRunner(debouncer, keep, error_backoff_ms=50)
    try:
        async with running(runner):
            await debouncer.record("conv", message(0))
            await eventually(lambda: turns)
            # The first turn's finish reaches Redis before it stops: otherwise its lease is still
            # out after the restart, and the turn is run again when the lease ends.
            await eventually(lambda: runner.running == 0)
            await debouncer.record("conv", message(1))
            server.stop()
            with pytest.raises(DebounceUnavailable):
                await debouncer.record("conv", message(2))
            assert debouncer.stats.fail_open == 1
            server.start()
            await eventually(lambda: len(turns) == 2)  # the runner rode out the outage
    finally:
        await client.aclose()
        server.stop()
    assert [[m.value for m in t.messages] for t in turns] == [[b"m0"], [b"m1"]]


async def test_a_step_sent_again_after_its_reply_was_lost_returns_the_same_turns(redis, unique):
    """A db_step the client sends again (its reply lost) hands back its turns, attempt unraised."""
    policy = DebouncePolicy(key="c", quiet_s=0.1, max_wait_s=5.0, max_batch=1)  # due at once
    debouncer = Debouncer(redis, PREFIX, f"deb_{unique}", policy)
    await debouncer.record("conv", message(0))
    shape = ((0, 0, 1), 600_000)  # (quiet_ms, max_wait_ms, max_batch), idle_ttl_ms

    async def step(endings: list[Ending]) -> Leased:  # the same call, as the retry policy sends it
        return await debouncer.functions.step(10, 30_000, "runner:7", endings, *shape)

    first = await step([])
    again = await step([])  # the first reply was lost: its turn was leased to no one
    assert again.turns == first.turns
    (turn,) = again.turns
    assert (turn[0], turn[1], int(turn[2])) == (b"conv", b"runner:7:1", 1)
    ended = [Ending("conv", "runner:7:1", ok=True, retry_in_ms=0)]
    finished = await debouncer.functions.step(10, 30_000, "runner:8", ended, *shape)
    retried = await debouncer.functions.step(10, 30_000, "runner:8", ended, *shape)
    assert finished.outcomes == retried.outcomes == ("done",)  # not a lost lease
