"""fake_redis runs the project's own Lua libraries: each answers as only its Lua would.

Parking, throttles and the debouncer fail open when Redis errs, so each test checks an answer
that a failing (open) call cannot give.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from pipeline.admission.debounce import Debouncer
from pipeline.admission.throttle import Throttle
from pipeline.envelope import Message
from pipeline.retry.parking import Parking
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


async def test_parking_diverts_a_key_behind_its_parked_head(redis: Redis) -> None:
    """After a key's head is parked in a retry tier, the key's next message is diverted."""
    parking = Parking(redis, "pl", "lane", ttl_ms=60_000)
    head, later = message(b"k", 0), message(b"k", 1)
    assert (await parking.begin(head, ordered=True))[0] == "process"
    await parking.end(head, "parked", follow_dead=True)
    assert (await parking.begin(later, ordered=True))[0] == "divert"
    assert (await parking.begin(message(b"other", 2), ordered=True))[0] == "process"


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
