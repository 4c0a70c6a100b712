"""A throttled lane's delivery has a ``throttle wait`` span naming its keys and priority."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, running
from tracing.otlp_receiver import OtlpReceiver

from pipeline import headers as h
from pipeline import tracing
from pipeline.admission.throttle import Throttle
from pipeline.envelope import Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


async def test_each_throttled_delivery_records_its_wait_with_keys_and_priority(
    transport: Transport, redis: Redis, unique: str, traced: OtlpReceiver
) -> None:
    """Under ``process``, before ``guard``: the wait for org:acme's one slot, at priority 70."""
    policy = {"keys": ["org:{tenant}"], "priority": 70}
    spec = lane_spec(f"thr_{unique}", 1, ordered=False, throttle=policy)
    await declare(transport, spec)
    app = App([spec])
    done: list[bytes] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        await asyncio.sleep(0.02)  # simulated work holds the slot
        done.append(event)

    throttle = Throttle(redis, prefix=f"t{unique}", namespace=unique, default_limit=1)
    await throttle.start()
    producer = transport.producer()
    records = [Record(b"%d" % n, b"k%d" % n, {h.TENANT: b"acme"}) for n in range(3)]
    await producer.send_many(spec.name, records)
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST, throttle=throttle)
    async with running(member):
        await eventually(lambda: len(done) == 3)
    await throttle.close()
    tracing.shutdown()
    admin = transport.admin()
    await admin.delete_group(f"g-{unique}", [spec.name])
    for name in spec.topic_names():
        await admin.delete_topic(name)
    keys = [key async for key in redis.scan_iter(f"*t{unique}*")]
    if keys:
        await redis.delete(*keys)

    traces = traced.traces().values()
    assert len(traces) == 3
    for spans in traces:
        named = {s.name: s for s in spans}
        assert sorted(named) == sorted(
            ["partition wait", f"process {spec.name}", "throttle wait", "guard", "handler"]
        )
        process, wait = named[f"process {spec.name}"], named["throttle wait"]
        assert process.parent_id == ""  # no traceparent came with the message: a new trace
        assert named["partition wait"].parent_id == process.span_id
        assert wait.parent_id == named["guard"].parent_id == process.span_id
        assert wait.start_ns == process.start_ns
        assert wait.end_ns <= named["guard"].start_ns  # admitted, then guarded
        assert wait.attributes["pipeline.throttle.keys"] == ["org:acme"]
        assert wait.attributes["pipeline.throttle.priority"] == 70
        assert process.attributes["pipeline.tenant"] == "acme"
