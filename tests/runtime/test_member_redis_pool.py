"""The member's Redis client waits for a free connection of its pool instead of failing the call.

A member whose Redis has no function channel (a ``rediss://`` or ``unix://`` URL) sends every
call of the guard, parking, ``ctx.once``, debouncing and the throttle through redis-py's pool of
:data:`~pipeline.runtime.run.MEMBER_CONNECTIONS`. redis-py's default pool refused a call past
them with ``ConnectionError("Too many connections")``, which each caller takes for Redis down:
300 handlers started at once on a lane with ``ctx.once`` had 200 claims or settles refused: with
the lane's default attempts 199 messages were dead-lettered; allowed five, they were retried 408
times with as many "parking unavailable" warnings, and 200 effects that had run ran again.

The real Redis is reached through a Unix socket forwarded to its TCP port (its own Unix socket is
off), so the client is the one ``pipeline consume`` builds for such a URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from runtime.helpers import eventually, lane_spec, produce, running
from runtime.owned import Declare

from pipeline import headers as h
from pipeline.config import PressureSettings, RuntimeSettings, Settings
from pipeline.envelope import Record
from pipeline.redis_channel import channel_of, open_channel
from pipeline.runtime import App, Context
from pipeline.runtime.idempotency import IdempotencyGuard
from pipeline.runtime.member import Member
from pipeline.runtime.run import MEMBER_CONNECTIONS, redis_client
from pipeline.transport.protocol import Transport

BURST = 3 * MEMBER_CONNECTIONS


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65_536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


@pytest.fixture
async def unix_redis(redis_service: str) -> AsyncIterator[str]:
    """A ``unix://`` URL of the test Redis: each connection is forwarded to its TCP port."""
    url = urlsplit(redis_service)
    forwarding: set[asyncio.Future[tuple[None, None]]] = set()

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(
            url.hostname or "127.0.0.1", url.port or 6379
        )
        task = asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        forwarding.add(task)
        task.add_done_callback(forwarding.discard)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    directory = Path(tempfile.mkdtemp(prefix="rp", dir="/tmp"))  # a socket's path is short
    path = directory / "redis.sock"
    server = await asyncio.start_unix_server(forward, path)
    db = url.path.strip("/") or "0"
    try:
        yield f"unix://{path}?db={db}"
    finally:
        server.close()
        for task in list(forwarding):
            task.cancel()
        await server.wait_closed()
        shutil.rmtree(directory, ignore_errors=True)


def _with_url(settings: Settings, url: str, **redis: object) -> Settings:
    return settings.model_copy(
        update={"redis": settings.redis.model_copy(update={"url": url, **redis})}
    )


@pytest.mark.parametrize("transport", ["redis"], indirect=True)
async def test_a_burst_of_handlers_past_the_pool_runs_each_effect_once(
    transport: Transport,
    lanes: Declare,
    prefix: str,
    unix_redis: str,
    settings: Settings,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """300 handlers on a Unix-socket Redis claim and settle their ``ctx.once`` together.

    Each effect waits until every one of them runs, so their claims, and then their settles,
    are all in flight at once: three times the pool's connections. None fails or is retried.
    """
    redis = redis_client(_with_url(settings, unix_redis))
    assert open_channel(redis) is None  # a Unix socket: every call takes a pool connection
    spec = lane_spec(f"pool_{unique}", 1, ordered=False, retry={"tiers": ["200ms"]})
    await lanes(spec)
    app = App([spec])
    effects: Counter[str] = Counter()
    everyone_in = asyncio.Event()

    async def charge(event_id: str) -> None:
        effects[event_id] += 1
        if len(effects) == BURST:
            everyone_in.set()
        await everyone_in.wait()

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        event_id = ctx.event_id or ""
        await ctx.once("charge", lambda: charge(event_id))

    records = [Record(b"x", f"k{i}".encode(), {h.EVENT_ID: f"e{i}".encode()}) for i in range(BURST)]
    await produce(transport, spec.name, records)
    runtime = RuntimeSettings(
        commit_interval_ms=100,
        shutdown_grace_s=5.0,
        max_concurrency=BURST,
        pressure=PressureSettings(enabled=False),  # all of them run at once, however busy
    )
    member = Member(app, transport, f"g-{unique}", runtime, redis=redis, redis_prefix=prefix)
    caplog.set_level(logging.WARNING, logger="pipeline")
    try:
        async with running(member):
            await eventually(lambda: member.stats.handled + member.stats.dead_lettered >= BURST)
    finally:
        await redis.aclose()
    assert member.stats.handled == BURST
    assert member.stats.retried == 0
    assert sorted(set(effects.values())) == [1], Counter(effects.values())
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def _take_every_connection(client: Redis) -> list[Connection]:
    """Every connection of ``client``'s pool, taken as calls in flight take them."""
    pool = client.connection_pool
    return [await pool.get_connection() for _ in range(MEMBER_CONNECTIONS)]  # type: ignore[no-untyped-call]


async def test_a_call_past_the_pool_waits_for_a_connection(
    redis_service: str, settings: Settings
) -> None:
    """With every connection taken, a call waits for one to come back and then runs."""
    client = redis_client(_with_url(settings, redis_service))
    try:
        taken = await _take_every_connection(client)
        waiting = asyncio.ensure_future(client.ping())
        # Still waiting once it has run (redis-py's default pool refused it at once).
        done, _ = await asyncio.wait({waiting}, timeout=0.2)
        assert not done
        await client.connection_pool.release(taken.pop())
        assert await asyncio.wait_for(waiting, 30) is True
        for connection in taken:
            await client.connection_pool.release(connection)
    finally:
        await client.aclose()


async def test_a_call_waiting_for_a_connection_fails_after_the_socket_timeout(
    redis_service: str, settings: Settings
) -> None:
    """The wait lasts ``socket_timeout_s`` at most, then a ``ConnectionError`` as callers expect."""
    # The timeout also bounds each connect and each close of the pool's connections: 1 s leaves
    # a loaded machine room to open and close them all (0.2 s timed out closing them).
    client = redis_client(_with_url(settings, redis_service, socket_timeout_s=1.0))
    try:
        taken = await _take_every_connection(client)
        with pytest.raises(rexc.ConnectionError, match="No connection available"):
            await asyncio.wait_for(client.ping(), 30)
        for connection in taken:
            await client.connection_pool.release(connection)
        assert await client.ping() is True  # the pool serves again
    finally:
        await client.aclose()


async def test_the_function_channel_still_binds_to_the_members_client(
    redis_service: str, settings: Settings, unique: str
) -> None:
    """On plain TCP the member's client keeps its function channel and the guard runs on it."""
    client = redis_client(_with_url(settings, redis_service))
    channel = open_channel(client)
    try:
        assert channel is not None
        assert channel_of(client) is channel
        guard = IdempotencyGuard(client, f"t{unique}", lease_ms=2_000)
        assert await guard.once("lane", "evt-1", "charge", _charged) == "charged"
        assert await guard.once("lane", "evt-1", "charge", _charged) is None
    finally:
        if channel is not None:
            await channel.aclose()
        await client.aclose()


async def _charged() -> str:
    return "charged"
