"""fake_redis runs the project's own Lua libraries: each answers as only its Lua would.

The run guard (parking), throttles and the debouncer fail open when Redis errs, so each test
checks an answer that a failing (open) call cannot give.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from pipeline.admission.debounce import Debouncer
from pipeline.admission.throttle import Throttle
from pipeline.envelope import Message
from pipeline.retry.guard_store import GuardStore, start_of
from pipeline.runtime.idempotency import IdempotencyGuard
from pipeline.testing import VirtualClock, fake_redis
from pipeline.topics.spec import DebouncePolicy


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    """A fresh in-process Redis, on a virtual clock."""
    clock = VirtualClock()
    clock.start()
    client = fake_redis()
    yield client
    await client.aclose()
    clock.stop()


def message(key: bytes, offset: int, value: bytes = b"{}") -> Message:
    """A consumed message of partition 0 of topic ``t``."""
    return Message("t", 0, offset, key, value, {})


async def test_a_parked_key_holds_its_next_message_behind_the_head(redis: Redis) -> None:
    """Once a key's head goes to a retry tier, the key's next message is held, others run."""
    guard = GuardStore(redis, "pl", "lane", ttl_ms=60_000)
    head, later, other = message(b"k", 0), message(b"k", 1), message(b"other", 2)
    (first,) = await guard.begin_many([], [start_of(head, ordered=True)])
    assert first[0] == "process"
    await guard.route(start_of(head, ordered=True), 2, park=True)
    assert (await guard.begin_parked(later, start_of(later, ordered=True)))[0] == "held"
    (unrelated,) = await guard.begin_many([], [start_of(other, ordered=True)])
    assert unrelated[0] == "process"


async def test_a_throttle_key_at_its_limit_makes_the_next_job_wait(redis: Redis) -> None:
    """With a limit of 1 the second job waits until the first releases its slot."""
    throttle = Throttle(redis, default_limit=1)
    await throttle.start()
    first = await throttle.acquire(["org:acme"])
    second = asyncio.create_task(throttle.acquire(["org:acme"]))
    done, _ = await asyncio.wait({second}, timeout=60)  # 60 virtual seconds
    assert not done
    assert not first.unconditional
    status = await throttle.status("org:acme")
    assert ([holder for holder, _ in status.holders], len(status.waiters)) == ([first.holder], 1)
    await throttle.release(first)
    permit = await second
    assert not permit.unconditional
    assert [holder for holder, _ in (await throttle.status("org:acme")).holders] == [permit.holder]
    await throttle.release(permit)
    await throttle.close()


async def test_the_debouncer_turns_a_burst_after_the_quiet_period(redis: Redis) -> None:
    """Two messages make one turn, due only once the quiet period has passed (virtual time)."""
    debouncer = Debouncer(redis, "pl", "lane", DebouncePolicy(key="c", quiet_s=4))
    await debouncer.record("conv", message(b"conv", 0, b"1"))
    await debouncer.record("conv", message(b"conv", 1, b"2"))
    assert (await debouncer.claim(10)).turns == ()
    await asyncio.sleep(4)
    (turn,) = (await debouncer.claim(10)).turns
    assert [m.value for m in turn.messages] == [b"1", b"2"]
    assert await debouncer.finish(turn, ok=True) == "done"


async def test_once_runs_an_effect_once_per_event(redis: Redis) -> None:
    """The second call for the same event and name does not run the effect."""
    guard = IdempotencyGuard(redis, "pl")
    runs: list[str] = []

    async def effect() -> str:
        runs.append("ran")
        return "result"

    assert await guard.once("lane", "evt-1", "ack", effect) == "result"
    assert await guard.once("lane", "evt-1", "ack", effect) is None
    assert await guard.once("lane", "evt-2", "ack", effect) == "result"
    assert runs == ["ran", "ran"]
