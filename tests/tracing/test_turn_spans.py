"""A debounced turn is one span linked to each message it coalesced; dead letters stay theirs."""

from __future__ import annotations

from pydantic import BaseModel
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, running
from tracing.otlp_receiver import OtlpReceiver

from pipeline import tracing
from pipeline.envelope import Record
from pipeline.errors import DeadLetter
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

QUIET = {"key": "conversation_id", "quiet_s": 3, "max_wait_s": 20, "max_batch": 50}
"""Quiet long enough that a burst read together is one turn on a loaded host: at 0.3 s, a stall
of the member between two of its records let the first ones' turn fall due alone."""


class Said(BaseModel):
    """One message of a conversation."""

    conversation_id: str
    n: int


async def test_a_turn_links_each_message_it_coalesced(
    transport: Transport, redis: Redis, unique: str, traced: OtlpReceiver
) -> None:
    """Three messages of three traces make one turn span with three links and a debounce wait."""
    spec = lane_spec(f"turns_{unique}", 1, debounce=QUIET)
    await declare(transport, spec)
    app = App([spec])
    seen: list[int] = []

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        seen.extend(e.n for e in events)

    contexts = [(f"{n + 1:032x}", f"{n + 1:016x}") for n in range(3)]
    records = [
        Record(
            Said(conversation_id="c1", n=n).model_dump_json().encode(),
            b"c1",
            {"traceparent": f"00-{trace_id}-{span_id}-01".encode()},
        )
        for n, (trace_id, span_id) in enumerate(contexts)
    ]
    producer = transport.producer()
    await producer.send_many(spec.name, records)
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: seen == [0, 1, 2])
    tracing.shutdown()
    admin = transport.admin()
    await admin.delete_group(f"g-{unique}", [spec.name])
    for name in spec.topic_names():
        await admin.delete_topic(name)
    keys = [key async for key in redis.scan_iter(f"*t{unique}*")]
    if keys:
        await redis.delete(*keys)

    spans = [s for trace in traced.traces().values() for s in trace]
    (turn,) = [s for s in spans if s.name == f"process {spec.lane} turn"]
    assert turn.kind == "SPAN_KIND_CONSUMER"
    assert set(turn.links) == set(contexts)
    assert turn.attributes["messaging.batch.message_count"] == 3
    (wait,) = [s for s in spans if s.name == "debounce wait"]
    assert (wait.trace_id, wait.parent_id) == (turn.trace_id, turn.span_id)
    assert wait.end_ns > wait.start_ns
    buffered = [s for s in spans if s.name == f"process {spec.name}"]
    assert sorted(s.trace_id for s in buffered) == [t for t, _ in contexts]
    assert {s.attributes["pipeline.outcome"] for s in buffered} == {"buffered"}


async def test_a_dead_lettered_turn_sends_each_message_on_in_its_own_trace(
    transport: Transport, redis: Redis, unique: str, traced: OtlpReceiver
) -> None:
    """A turn failing for good dead-letters each message under the context it arrived with."""
    spec = lane_spec(f"turndl_{unique}", 1, debounce=QUIET)
    await declare(transport, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        raise DeadLetter("conversation closed")

    contexts = [(f"{n + 7:032x}", f"{n + 7:016x}") for n in range(2)]
    records = [
        Record(
            Said(conversation_id="c1", n=n).model_dump_json().encode(),
            b"c1",
            {"traceparent": f"00-{trace_id}-{span_id}-01".encode()},
        )
        for n, (trace_id, span_id) in enumerate(contexts)
    ]
    producer = transport.producer()
    await producer.send_many(spec.name, records)
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: member.stats.dead_lettered == 2)
    tracing.shutdown()
    admin = transport.admin()
    await admin.delete_group(f"g-{unique}", [spec.name])
    for name in spec.topic_names():
        await admin.delete_topic(name)
    keys = [key async for key in redis.scan_iter(f"*t{unique}*")]
    if keys:
        await redis.delete(*keys)

    spans = [s for trace in traced.traces().values() for s in trace]
    sends = [s for s in spans if s.name == f"send {spec.dead_letter}"]
    assert sorted((s.trace_id, s.parent_id) for s in sends) == contexts
    assert {s.attributes["pipeline.dead_reason"] for s in sends} == {"fatal"}


async def test_process_and_turn_spans_name_the_consumer_group(
    transport: Transport, redis: Redis, unique: str, traced: OtlpReceiver
) -> None:
    """Each ``process`` span and the turn's carry ``messaging.consumer.group.name``.

    Before, no span named the group, which the messaging conventions ask of a consumer's
    ``process`` spans.
    """
    spec = lane_spec(f"turngroup_{unique}", 1, debounce=QUIET)
    await declare(transport, spec)
    app = App([spec])
    seen: list[int] = []

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        seen.extend(e.n for e in events)

    records = [
        Record(Said(conversation_id="c1", n=n).model_dump_json().encode(), b"c1") for n in (0, 1)
    ]
    producer = transport.producer()
    await producer.send_many(spec.name, records)
    await producer.close()
    group = f"g-{unique}"
    member = Member(app, transport, group, FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: seen == [0, 1])
    tracing.shutdown()
    admin = transport.admin()
    await admin.delete_group(group, [spec.name])
    for name in spec.topic_names():
        await admin.delete_topic(name)
    keys = [key async for key in redis.scan_iter(f"*t{unique}*")]
    if keys:
        await redis.delete(*keys)

    spans = [s for trace in traced.traces().values() for s in trace]
    named = [s for s in spans if s.name in (f"process {spec.name}", f"process {spec.lane} turn")]
    assert len(named) == 3
    assert [s.attributes.get("messaging.consumer.group.name") for s in named] == [group] * 3
