"""Long work across a Redis outage: heartbeats kept in the member reach Redis before any verdict."""

from __future__ import annotations

import asyncio

from faults.services import PrivateRedis
from redis.asyncio import Redis
from runtime.helpers import RecordedFailures

from pipeline.cancel.functions import CancelFunctions
from pipeline.cancel.keys import CancelKeys
from pipeline.envelope import Message
from pipeline.runtime import App, Context
from pipeline.runtime.app import Lane
from pipeline.runtime.longwork import LongWork
from pipeline.runtime.stats import Stats
from pipeline.topics.spec import TopicSpec

TIMEOUT_S = 0.3
"""The lane's heartbeat timeout: the outage lasts longer."""


def _member(
    redis: Redis, prefix: str, lane: Lane, routing: RecordedFailures, started: asyncio.Event
) -> LongWork:
    async def call(lane: Lane, message: Message) -> str | None:
        started.set()
        await asyncio.Event().wait()  # long work, healthy all along
        return "handled"

    return LongWork(
        call,
        routing,  # type: ignore[arg-type]
        Stats(),
        [lane],
        functions=CancelFunctions(redis, prefix),
        poll_s=0.1,
    )


async def test_a_healthy_run_is_not_found_hung_after_an_outage_longer_than_its_timeout(
    private_redis: PrivateRedis, unique: str
) -> None:
    """The first member back from an outage does not stop another's run before it has beaten."""
    spec = TopicSpec.model_validate(
        {
            "name": f"long_{unique}",
            "partitions": 1,
            "heartbeat_timeout": f"{int(TIMEOUT_S * 1000)}ms",
        }
    )
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:  # the lane needs one; not called
        return None

    lane = app.lanes[spec.lane]
    clients = [Redis.from_url(private_redis.url, socket_timeout=1) for _ in range(2)]
    routing = RecordedFailures()
    started = asyncio.Event()
    runner, watcher = (_member(client, f"p{unique}", lane, routing, started) for client in clients)
    message = Message(spec.name, 0, 0, b"k", b"v")
    run = asyncio.create_task(runner(lane, message))
    try:
        await started.wait()
        await runner.tick()  # registers the run, with its first heartbeat
        await watcher.tick()
        assert await clients[1].hlen(CancelKeys(f"p{unique}").runs) == 1
        private_redis.kill()  # the outage: both members' syncs fail, their runs beat locally
        await runner.tick()
        await watcher.tick()
        await asyncio.sleep(2 * TIMEOUT_S)  # the outage lasts longer than the timeout
        await runner.tick()
        private_redis.start()
        await watcher.tick()  # the watcher's tick comes first after the outage
        await runner.tick()  # then the runner sends the heartbeats it kept
        await watcher.tick()
        await runner.tick()
        assert not run.done()
        assert routing.failures == []
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        for client in clients:
            await client.aclose()
