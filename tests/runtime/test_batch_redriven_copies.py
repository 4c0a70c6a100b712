"""A redriven batch message that fails again: its retry copy's SLA clock starts at the redrive."""

from __future__ import annotations

import asyncio
import time

from runtime.helpers import FAST, declare, eventually, lane_spec, running

from pipeline import headers as h
from pipeline.envelope import Message, Record
from pipeline.redrive.redrive import Redrive, redriven
from pipeline.redrive.select import Selection
from pipeline.retry.router import RetryRouter, _with_origin
from pipeline.runtime import App, Context
from pipeline.runtime.batch import BatchGate
from pipeline.runtime.member import Member
from pipeline.topics.spec import BatchPolicy
from pipeline.transport.protocol import Transport

POLICY = BatchPolicy.model_validate({"idle_below": 0.5, "sla": "10s", "promote_at": 0.5})
_DAY_MS = 86_400_000


def _busy_gate(started: list[int], now_ms: int = 20_000) -> BatchGate[Message]:
    """A gate of a member whose handlers in use or queued fill its limit (4 of 4)."""
    return BatchGate(lambda m: started.append(m.offset), lambda: (4, 4), clock_ms=lambda: now_ms)


def _copy_of(message: Message, offset: int, copied_ms: int) -> Message:
    """The retry copy the router writes of ``message`` (its headers, with a due time)."""
    headers = _with_origin(message)
    headers[h.DUE_MS] = str(copied_ms + 100).encode()
    return Message("bulk.retry.1", 0, offset, message.key, message.value, headers, copied_ms)


def test_the_copy_of_a_redriven_message_is_judged_from_the_redrive() -> None:
    """The dead letter's first production (19 s before) does not promote the copy at once."""
    started: list[int] = []
    gate = _busy_gate(started)
    dead = Message("bulk.dlq", 0, 3, b"k", b"", {h.PRODUCED_AT_MS: b"1000"}, 1_500)
    again = Message(
        "bulk", 0, 5, b"k", b"", dict(redriven(dead, "bulk.dlq").headers or {}), 19_000
    )  # redriven 1 s ago
    gate.offer(again, "bulk", POLICY)
    assert started == []  # judged by its own time: held while busy
    gate.offer(_copy_of(again, 6, copied_ms=19_400), "bulk", POLICY)
    assert started == [], f"the copy of a 1 s old redriven message was promoted: {started}"
    assert gate.waiting == 2


def test_a_copy_of_a_copy_keeps_the_clock_of_the_first_failure() -> None:
    """Later tiers keep the start of the SLA clock: a copy failing again is not reset."""
    started: list[int] = []
    gate = _busy_gate(started)
    fresh = Message("bulk", 0, 1, b"k", b"", {}, 14_000)
    first = _copy_of(fresh, 2, copied_ms=16_000)
    second = _copy_of(first, 3, copied_ms=19_900)
    assert second.headers[h.SLA_FROM_MS] == b"14000"
    assert second.headers[h.PRODUCED_AT_MS] == b"14000"
    gate.offer(second, "bulk", POLICY)
    assert started == [3]  # 6 s since its event was produced: past promote_at (5 s)


def test_the_redriven_message_starts_a_new_clock_whatever_it_carries() -> None:
    """Redrive drops the dead letter's clock, and the router resets one a message still has."""
    dead = Message(
        "bulk.dlq", 0, 3, b"k", b"", {h.PRODUCED_AT_MS: b"1000", h.SLA_FROM_MS: b"1000"}, 1_500
    )
    headers = dict(redriven(dead, "bulk.dlq").headers or {})
    assert h.SLA_FROM_MS not in headers
    assert headers[h.PRODUCED_AT_MS] == b"1000"  # a cancellation still judges by it
    # A redrive by an earlier version kept the header: a message without a due time is not a
    # copy, so its own time is where its copies' clock starts.
    stale = Message("bulk", 0, 5, b"k", b"", dict(dead.headers), 19_000)
    copy = _copy_of(stale, 6, copied_ms=19_400)
    assert copy.headers[h.SLA_FROM_MS] == b"19000"
    assert copy.headers[h.PRODUCED_AT_MS] == b"1000"


def test_copies_written_before_the_sla_header_count_as_before() -> None:
    """A copy without pl-sla-from-ms: its first production, unless it was redriven."""
    started: list[int] = []
    gate = _busy_gate(started)
    due = {h.DUE_MS: b"19500", h.PRODUCED_AT_MS: b"14000"}
    gate.offer(Message("bulk.retry.1", 0, 1, b"a", b"", due, 19_400), "bulk", POLICY)
    assert started == [1]
    redriven_copy = {**due, h.REDRIVE_COUNT: b"1"}
    gate.offer(Message("bulk.retry.1", 0, 2, b"b", b"", redriven_copy, 19_400), "bulk", POLICY)
    assert started == [1]
    assert gate.waiting == 1


async def test_a_redriven_batch_message_failing_again_waits_for_idle_capacity(
    transport: Transport, unique: str
) -> None:
    """A week-old dead letter redriven into a busy batch lane fails once: its copy is held.

    The lane's SLA is 1 h, promoted at half of it. The dead letter's event was first produced
    a week ago; redriven now, it runs while the member is idle and fails as interactive work
    fills the member. Its copy, written by the member's router, must wait for idle capacity
    like any fresh batch work, not be promoted by the week-old first production.
    """
    inter = lane_spec(f"inter_{unique}", 1, ordered=False)
    bulk = lane_spec(
        f"bulk_{unique}",
        1,
        ordered=False,
        retry={"tiers": ["200ms"], "max_attempts": 3},
        batch={"idle_below": 0.5, "sla": "1h", "promote_at": 0.5},
    )
    await declare(transport, inter, bulk)
    app = App([inter, bulk])
    release, filled, failing = asyncio.Event(), asyncio.Event(), asyncio.Event()
    ran: list[int] = []

    @app.handler(inter.lane)
    async def interactive(event: Message, ctx: Context) -> None:
        await release.wait()

    @app.handler(bulk.lane)
    async def batch(event: Message, ctx: Context) -> None:
        attempt = h.attempt_header(event.headers)
        if attempt == 1:
            failing.set()
            await filled.wait()
            raise RuntimeError("still flaky")
        ran.append(attempt)

    producer = transport.producer()
    try:
        week_ago = int(time.time() * 1000) - 7 * _DAY_MS
        first = Message(bulk.name, 0, 0, b"k", b"v", {h.EVENT_ID: b"e1"}, week_ago)
        routes = app.lanes[bulk.lane].routes
        await RetryRouter(producer).dead_letter(routes, first, "exhausted", RuntimeError("down"))
        report = await Redrive(transport, bulk.dead_letter, Selection()).run()
        assert report.moved == 1
        member = Member(
            app, transport, f"g-{unique}", FAST.model_copy(update={"max_concurrency": 4})
        )
        async with running(member):
            await asyncio.wait_for(failing.wait(), 60)  # idle: the redriven message runs
            await producer.send_many(inter.name, [Record(b"i%d" % i, None) for i in range(3)])
            await eventually(lambda: member._chain.lanes.running == 4)
            filled.set()  # it fails with 3 of 4 handlers busy: above idle_below
            await eventually(lambda: member.batch_waiting == 1 or ran != [])
            assert ran == [], "the copy was promoted by its event's first production"
            assert member.batch_waiting == 1
            release.set()
            await eventually(lambda: ran == [2])
    finally:
        release.set()
        filled.set()
        await producer.close()
