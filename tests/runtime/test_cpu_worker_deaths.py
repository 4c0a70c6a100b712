"""A cpu=True handler that kills its worker every time, beside one that works, on a real member.

Checks what the audit of the pool under failure asked: the message whose handler kills its
worker (SIGKILL, as the OOM killer sends) is retried and ends in the dead-letter topic after its
attempts, not in a loop; the message running on the other worker at the time is not disturbed;
the pool is refilled, so the lane goes on.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator

import pytest
import redis
from contract.helpers import consume_until
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


def _client() -> redis.Redis:
    return redis.Redis.from_url(os.environ.get("PIPELINE_REDIS__URL", "redis://127.0.0.1:6379/0"))


def die_or_work(event: bytes, ctx: Context) -> None:
    """``die`` SIGKILLs its worker every attempt; ``slow`` waits until ``die`` killed one first.

    Each run pushes ``<event>:<attempt>:<pid>`` onto ``cpu-deaths:<lane>`` before anything else.
    """
    client = _client()
    key = f"cpu-deaths:{ctx.lane}"
    try:
        client.rpush(key, f"{event.decode()}:{ctx.attempt}:{os.getpid()}")
        if event == b"slow":  # running on the other worker while ``die`` kills its own
            client.blpop([f"{key}:died"], timeout=60)
    finally:
        client.close()
    if event == b"die":
        client = _client()
        try:
            client.rpush(f"{key}:died", "1")
        finally:
            client.close()
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture
async def deaths(redis_service: str, unique: str) -> AsyncIterator[tuple[Redis, str]]:
    """The Redis list the runs are pushed onto (deleted with its ``:died`` list after)."""
    client = Redis.from_url(redis_service)
    key = f"cpu-deaths:cpu_deaths_{unique}"
    yield client, key
    await client.delete(key, f"{key}:died")
    await client.aclose()


async def test_a_handler_that_kills_its_worker_is_dead_lettered_and_disturbs_no_other(
    transport: Transport, deaths: tuple[Redis, str], unique: str
) -> None:
    """``die`` goes to the dead letters after 3 attempts; ``slow`` and ``after`` run once."""
    client, key = deaths
    spec = lane_spec(
        f"cpu_deaths_{unique}", 1, ordered=False, retry={"tiers": ["200ms"], "max_attempts": 3}
    )
    await declare(transport, spec)
    app = App([spec])
    app.handler(spec.lane, cpu=True)(die_or_work)
    await produce(transport, spec.name, [Record(b"slow"), Record(b"die")])
    member = Member(app, transport, f"g-{unique}", FAST)  # two workers (cpu_workers)
    async with running(member):
        await eventually(
            lambda: member.stats.handled == 1 and member.stats.dead_lettered == 1, timeout_s=90
        )
        await produce(transport, spec.name, [Record(b"after")])
        await eventually(lambda: member.stats.handled == 2, timeout_s=90)
    runs = [run.decode().rsplit(":", 1)[0] for run in await client.lrange(key, 0, -1)]
    assert sorted(runs) == ["after:1", "die:1", "die:2", "die:3", "slow:1"]
    assert member.stats.retried == 2
    dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
    (dead,) = await consume_until(dlq, lambda got: len(got) >= 1)
    await dlq.close()
    assert dead.value == b"die"
    assert dead.headers[h.ERROR_CLASS] == b"pipeline.runtime.cpu.WorkerCrashed"
    assert dead.headers[h.ATTEMPT] == b"3"
