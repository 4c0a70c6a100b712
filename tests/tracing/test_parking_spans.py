"""A follower held behind its parked key keeps its own trace: held, then released and handled."""

from __future__ import annotations

from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, running
from tracing.otlp_receiver import OtlpReceiver

from pipeline import tracing
from pipeline.envelope import Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


async def test_a_held_follower_is_parked_and_released_in_its_own_trace(
    transport: Transport, redis: Redis, unique: str, traced: OtlpReceiver
) -> None:
    """The head's retry parks its key; the follower's spans (parked, then handled) are its own."""
    spec = lane_spec(f"park_{unique}", 1, retry={"tiers": ["300ms"]})
    await declare(transport, spec)
    app = App([spec])
    done: list[bytes] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"head" and ctx.attempt == 1:
            raise RuntimeError("flaky dependency")
        done.append(event)

    head, follower = "a" * 32, "b" * 32
    records = [
        Record(b"head", b"k", {"traceparent": f"00-{head}-{'1' * 16}-01".encode()}),
        Record(b"follower", b"k", {"traceparent": f"00-{follower}-{'2' * 16}-01".encode()}),
    ]
    producer = transport.producer()
    await producer.send_many(spec.name, records)
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: done == [b"head", b"follower"])
    tracing.shutdown()
    admin = transport.admin()
    await admin.delete_group(f"g-{unique}", [spec.name, *spec.retry_topic_names()])
    for name in spec.topic_names():
        await admin.delete_topic(name)
    keys = [key async for key in redis.scan_iter(f"*t{unique}*")]
    if keys:
        await redis.delete(*keys)

    traces = traced.traces()
    theirs = [s for s in traces[follower] if s.name.startswith("process ")]
    assert [s.attributes["pipeline.outcome"] for s in theirs] == ["parked", "handled"]
    assert "parked" in theirs[0].events
    assert [s.name for s in traces[follower] if s.name == "handler"] == ["handler"]
    assert len([s for s in traces[head] if s.name == "handler"]) == 2  # none of the follower's
    assert [
        s.attributes["pipeline.outcome"] for s in traces[head] if s.name.startswith("process")
    ] == [
        "retried",
        "handled",
    ]
