"""The throttle across a restart of its Redis (a private redis-server of this test's own)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ingress.redis_server import RedisServer
from redis.asyncio import Redis
from runtime.helpers import eventually

from pipeline.admission.throttle import Throttle


@pytest.fixture
async def private_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A redis-server of this test's own (append-only file), stoppable and restartable."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def throttle(private_redis: RedisServer) -> AsyncIterator[Throttle]:
    """A started throttle (limit 1) on the private server."""
    client = Redis.from_url(private_redis.url, socket_connect_timeout=0.5)
    t = Throttle(client, namespace="restart", default_limit=1, lease_ms=1500, wake_block_s=0.5)
    await t.start()
    yield t
    await t.close()
    await client.aclose()


async def test_restart_with_persistence_keeps_queue(private_redis, throttle):
    """With the append-only file the holder and the waiter survive; the release still wakes it."""
    held = await throttle.acquire(["org:a"])
    waiting = asyncio.create_task(throttle.acquire(["org:a"]))
    await eventually(lambda: throttle.waited == 1, 10)
    private_redis.stop()
    private_redis.start()
    await throttle.release(held)
    permit = await asyncio.wait_for(waiting, 10)
    assert not permit.unconditional
    assert [h for h, _ in (await throttle.status("org:a")).holders] == [permit.holder]
    assert throttle.lost == 0


async def test_restart_losing_state_requeues_waiters(private_redis, throttle):
    """When Redis comes back empty, the waiter is queued again and granted; nothing is lost."""
    held = await throttle.acquire(["org:a"])
    waiting = asyncio.create_task(throttle.acquire(["org:a"]))
    await eventually(lambda: throttle.waited == 1, 10)
    private_redis.stop()
    shutil.rmtree(private_redis.directory)
    private_redis.start()
    permit = await asyncio.wait_for(waiting, 10)  # the next heartbeat finds both permits gone
    assert not permit.unconditional
    assert throttle.lost == 2
    await throttle.release(held)  # a lost permit releases harmlessly
    assert [h for h, _ in (await throttle.status("org:a")).holders] == [permit.holder]


async def test_redis_down_fails_open(private_redis, throttle):
    """While Redis is down new work is admitted unconditionally and waiters are let go."""
    held = await throttle.acquire(["org:a"])
    waiting = asyncio.create_task(throttle.acquire(["org:a"]))
    await eventually(lambda: throttle.waited == 1, 10)
    private_redis.stop()
    assert (await throttle.acquire(["org:a"])).unconditional
    permit = await asyncio.wait_for(waiting, 20)  # after one lease of failed heartbeats
    assert permit.unconditional
    assert throttle.fail_open >= 2
    private_redis.start()
    await throttle.release(held)
    again = await throttle.acquire(["org:b"])
    assert not again.unconditional


async def test_error_replies_do_not_stop_the_lease_renewals(private_redis, throttle):
    """Redis refusing writes for a moment (out of memory): renewals go on once it recovers.

    Only a lost connection or a timeout was caught: the renewer ended at its first error reply,
    unlogged, and every permit held then lapsed in Redis while its handler still ran.
    """
    held = await throttle.acquire(["org:a"])
    admin = Redis.from_url(private_redis.url)
    try:
        await admin.config_set("maxmemory-policy", "noeviction")
        before = throttle.roundtrips
        await admin.config_set("maxmemory", "1")  # every write is refused: OOM
        await eventually(lambda: throttle.roundtrips > before, 10)  # a renewal was refused
        await admin.config_set("maxmemory", "0")
        refused = throttle.roundtrips
        await eventually(lambda: throttle.roundtrips >= refused + 2, 10)  # still renewing
        assert [h for h, _ in (await throttle.status("org:a")).holders] == [held.holder]
    finally:
        await admin.aclose()
    await throttle.release(held)


async def test_waiters_are_let_go_when_redis_answers_only_errors(private_redis, throttle):
    """Redis refusing every write (out of memory) for a lease: a waiter runs failed open.

    Before, only a lost connection or a timeout counted towards letting waiters go: with Redis
    answering errors (out of memory, a read-only replica after a failover) a waiter waited for
    as long as the errors lasted, while new work was admitted failed open ahead of it.
    """
    held = await throttle.acquire(["org:a"])
    waiting = asyncio.create_task(throttle.acquire(["org:a"]))
    await eventually(lambda: throttle.waited == 1, 10)
    admin = Redis.from_url(private_redis.url)
    try:
        await admin.config_set("maxmemory-policy", "noeviction")
        await admin.config_set("maxmemory", "1")  # every write is refused: OOM
        permit = await asyncio.wait_for(waiting, 20)  # after a lease (1.5 s) of refusals
        assert permit.unconditional
        await admin.config_set("maxmemory", "0")
    finally:
        await admin.aclose()
    await throttle.release(held)
