"""Lifecycle outcomes are span events: an expired message dropped, another dead-lettered."""

from __future__ import annotations

import time

from runtime.helpers import FAST, declare, eventually, lane_spec, running
from tracing.otlp_receiver import OtlpReceiver

from pipeline import headers as h
from pipeline import tracing
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


async def test_expired_messages_leave_events_and_never_a_handler_span(
    transport: Transport, unique: str, traced: OtlpReceiver
) -> None:
    """A dropped expiry is an ``expired`` event; a dead-lettered one also names its reason."""
    dropping = lane_spec(f"drop_{unique}", 1)
    routing = lane_spec(f"dlq_{unique}", 1, on_expiry="dead_letter")
    await declare(transport, dropping, routing)
    app = App([dropping, routing])
    handled: list[bytes] = []

    @app.handler(dropping.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        handled.append(event)

    @app.handler(routing.lane)
    async def handle_routed(event: bytes, ctx: Context) -> None:
        handled.append(event)

    past = b"%d" % (int(time.time() * 1000) - 1000)
    producer = transport.producer()
    for spec in (dropping, routing):
        await producer.send(spec.name, b"stale", key=b"k", headers={h.DEADLINE_MS: past})
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST)
    async with running(member):
        await eventually(lambda: member.stats.expired == 2 and member.stats.dead_lettered == 1)
    tracing.shutdown()
    admin = transport.admin()
    await admin.delete_group(f"g-{unique}", [dropping.name, routing.name])
    for spec in (dropping, routing):
        for name in spec.topic_names():
            await admin.delete_topic(name)

    spans = [s for trace in traced.traces().values() for s in trace]
    by_name = {s.name: s for s in spans}
    dropped = by_name[f"process {dropping.name}"]
    assert (dropped.attributes["pipeline.outcome"], dropped.events) == ("expired", ("expired",))
    routed = by_name[f"process {routing.name}"]
    assert routed.attributes["pipeline.outcome"] == "dead_lettered"
    assert "dead_lettered" in routed.events
    guard = next(s for s in spans if s.name == "guard" and s.parent_id == routed.span_id)
    assert "expired" in guard.events
    assert by_name[f"send {routing.dead_letter}"].parent_id == guard.span_id
    assert handled == []
    assert not any(s.name == "handler" for s in spans)
