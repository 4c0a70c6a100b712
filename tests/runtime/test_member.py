"""The runtime on both real brokers: per-key order, retries, dead letters, commits, backpressure."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import defaultdict
from collections.abc import Sequence

import pytest
from contract.helpers import consume_until
from runtime.helpers import FAST, declare, eventually, lane_spec, running

from pipeline import headers as h
from pipeline.envelope import Message, Record
from pipeline.errors import DeadLetter, Retry
from pipeline.runtime import App, Context
from pipeline.runtime.due import due_ms
from pipeline.runtime.member import Member
from pipeline.tracing.logs import JsonFormatter
from pipeline.transport.protocol import Transport


async def test_per_key_order_without_overlap(transport: Transport, unique: str) -> None:
    """Handler order per key equals produce order and one key never runs twice at once."""
    spec = lane_spec(f"order_{unique}", 4)
    await declare(transport, spec)
    app = App([spec])
    seen: dict[bytes, list[int]] = defaultdict(list)
    running_keys: set[bytes] = set()
    overlaps = 0

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        nonlocal overlaps
        key = event.key or b""
        overlaps += key in running_keys
        running_keys.add(key)
        await asyncio.sleep(random.uniform(0, 0.003))  # simulated I/O latency
        seen[key].append(int(event.value))
        running_keys.discard(key)

    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"%d" % i, b"k%d" % (i % 40)) for i in range(800)])
    member = Member(app, transport, f"g-{unique}", FAST)
    async with running(member):
        await eventually(lambda: member.stats.handled == 800)
    await producer.close()
    assert overlaps == 0
    assert all(values == sorted(values) for values in seen.values())
    assert sum(len(v) for v in seen.values()) == 800


async def test_retries_wait_for_their_tier_and_failures_reach_the_dead_letter_topic(
    transport: Transport, unique: str
) -> None:
    """Retries come back through the tiers, never early; fatal and exhausted ones reach the DLQ."""
    spec = lane_spec(f"retry_{unique}", 2, retry={"tiers": ["200ms", "400ms"]})
    await declare(transport, spec)
    app = App([spec])
    attempts: dict[bytes, list[int]] = defaultdict(list)
    early: list[bytes] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        attempts[event].append(ctx.attempt)
        if ctx.attempt > 1 and time.time() * 1000 < due_ms(ctx.message):
            early.append(event)
        if event.startswith(b"flaky") and ctx.attempt == 1:
            raise RuntimeError("upstream 503")
        if event.startswith(b"fatal"):
            raise DeadLetter("payload refers to a deleted account")
        if event.startswith(b"always"):
            raise Retry("still rate limited")

    producer = transport.producer()
    values = [b"ok-1", b"flaky-1", b"fatal-1", b"always-1", b"ok-2", b"flaky-2"]
    await producer.send_many(spec.name, [Record(v, b"k-" + v) for v in values])
    member = Member(app, transport, f"g-{unique}", FAST)
    async with running(member):
        await eventually(lambda: member.stats.handled == 4 and member.stats.dead_lettered == 2)
    await producer.close()
    assert attempts[b"flaky-1"] == [1, 2]
    assert attempts[b"always-1"] == [1, 2, 3]
    assert attempts[b"fatal-1"] == [1]
    assert early == []
    dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
    dead = {m.value: m for m in await consume_until(dlq, lambda r: len(r) >= 2)}
    await dlq.close()
    assert set(dead) == {b"fatal-1", b"always-1"}
    fatal, exhausted = dead[b"fatal-1"].headers, dead[b"always-1"].headers
    assert fatal[h.DEAD_REASON] == b"fatal"
    assert fatal[h.ERROR_CLASS] == b"pipeline.errors.DeadLetter"
    assert fatal[h.ORIGIN_TOPIC] == spec.name.encode()
    assert exhausted[h.DEAD_REASON] == b"exhausted"
    assert exhausted[h.ATTEMPT] == b"3"
    assert exhausted[h.ORIGIN_TOPIC] == spec.name.encode()
    assert int(exhausted[h.FIRST_FAILURE_MS]) <= int(exhausted[h.LAST_FAILURE_MS])
    assert dead[b"always-1"].key == b"k-always-1"


async def test_finished_work_is_not_redone_after_a_restart(
    transport: Transport, unique: str
) -> None:
    """Offsets done above a stuck one are committed as metadata and skipped by the next member."""
    spec = lane_spec(f"meta_{unique}", 1)
    await declare(transport, spec)
    first_app, second_app = App([spec]), App([spec])
    stuck = asyncio.Event()
    first_done: list[bytes] = []
    second_done: list[bytes] = []

    @first_app.handler(spec.lane)
    async def first(event: bytes, ctx: Context) -> None:
        if event == b"stuck":
            await stuck.wait()  # never set: this handler is still running at shutdown
        first_done.append(event)

    @second_app.handler(spec.lane)
    async def second(event: bytes, ctx: Context) -> None:
        second_done.append(event)

    producer = transport.producer()
    records = [Record(b"stuck", b"a")] + [Record(b"v%d" % i, b"k%d" % i) for i in range(20)]
    await producer.send_many(spec.name, records)
    await producer.close()
    impatient = FAST.model_copy(update={"shutdown_grace_s": 0.2})
    member = Member(first_app, transport, f"g-{unique}", impatient)
    async with running(member):
        await eventually(lambda: len(first_done) == 20)
    successor = Member(second_app, transport, f"g-{unique}", FAST)
    async with running(successor):
        await eventually(lambda: second_done == [b"stuck"] and successor.stats.already_done == 20)
    assert b"stuck" not in first_done


async def test_expired_messages_are_dropped_not_processed(
    transport: Transport, unique: str
) -> None:
    """A message past its deadline header is counted and dropped; a fresh one is handled."""
    spec = lane_spec(f"deadline_{unique}", 1)
    await declare(transport, spec)
    app = App([spec])
    handled: list[bytes] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        handled.append(event)

    past, future = int(time.time() * 1000) - 1000, int(time.time() * 1000) + 600_000
    producer = transport.producer()
    await producer.send(spec.name, b"stale", key=b"k", headers={h.DEADLINE_MS: b"%d" % past})
    await producer.send(spec.name, b"fresh", key=b"k", headers={h.DEADLINE_MS: b"%d" % future})
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST)
    async with running(member):
        await eventually(lambda: member.stats.handled == 1 and member.stats.expired == 1)
    assert handled == [b"fresh"]


async def test_a_full_partition_pauses_and_memory_stays_bounded(
    transport: Transport, unique: str
) -> None:
    """With handlers blocked, buffered messages stop near the high-water mark, then drain."""
    spec = lane_spec(f"flow_{unique}", 1)
    await declare(transport, spec)
    app = App([spec])
    gate = asyncio.Event()

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        await gate.wait()

    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"x", b"k%d" % i) for i in range(2000)])
    await producer.close()
    tight = FAST.model_copy(
        update={
            "partition_high_water": 100,
            "partition_low_water": 20,
            "poll_max": 50,
            "max_concurrency": 8,
        }
    )
    member = Member(app, transport, f"g-{unique}", tight)
    peak = 0
    async with running(member):
        await eventually(lambda: member._chain.lanes.buffered >= 100)
        for _ in range(50):  # keep polling a while: the paused partition must not refill
            peak = max(peak, member._chain.lanes.buffered)
            await asyncio.sleep(0.02)
        gate.set()
        await eventually(lambda: member.stats.handled == 2000)
    assert peak <= 100 + 50


class RecordingMarker:
    """Stands in for the ingress log store: remembers which rows it was told are processed."""

    def __init__(self) -> None:
        """Nothing marked yet."""
        self.rows: list[str] = []

    async def mark_processed(self, ids: Sequence[str]) -> int:
        """Record the batch."""
        self.rows += ids
        return len(ids)


async def test_finished_events_mark_their_log_rows_processed(
    transport: Transport, unique: str
) -> None:
    """Handled and dead-lettered events mark their log rows; a retry waits for its outcome."""
    spec = lane_spec(f"rows_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"bad":
            raise DeadLetter("unprocessable")
        if event == b"flaky" and ctx.attempt == 1:
            raise RuntimeError("try again")

    producer = transport.producer()
    records = [Record(v, v, {h.ROW_ID: b"row-" + v}) for v in (b"ok", b"bad", b"flaky")]
    await producer.send_many(spec.name, [*records, Record(b"no-row", b"x")])
    await producer.close()
    marker = RecordingMarker()
    member = Member(app, transport, f"g-{unique}", FAST, processed=marker)
    async with running(member):
        await eventually(lambda: len(marker.rows) == 3)
    assert sorted(marker.rows) == ["row-bad", "row-flaky", "row-ok"]


async def test_a_run_from_before_its_partition_came_back_does_not_finish_the_new_copy(
    transport: Transport, unique: str
) -> None:
    """A copy read before a revocation, still running, ends in its own assignment's offsets.

    The revocation's grace ran out with it running, the partition came back, and its offset
    was read again; that second copy waits behind it. Were the first copy's end counted for
    the new assignment, its position would pass an offset whose copy has not run, and the
    partition's next owner would start past it while it still runs here.
    """
    spec = lane_spec(f"back_{unique}", 1)
    await declare(transport, spec)
    app = App([spec])
    go = [asyncio.Event(), asyncio.Event()]
    runs: list[Message] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        runs.append(ctx.message)
        await go[len(runs) - 1].wait()

    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"m", b"k")])
    await producer.close()
    impatient = FAST.model_copy(update={"shutdown_grace_s": 0.05})
    member = Member(app, transport, f"g-{unique}", impatient)
    async with running(member):
        await eventually(lambda: len(runs) == 1)
        message = runs[0]
        tp = message.tp
        await member.on_revoked([tp], lost=False)  # its grace runs out: the copy still runs
        await member.on_assigned([tp], {})
        member._dispatch(message)  # read again in the new assignment: it waits behind
        go[0].set()
        await eventually(lambda: member.stats.handled == 1)
        assert member._offsets[tp].position().offset == message.offset  # its copy has not run
        go[1].set()
        await eventually(lambda: member.stats.handled == 2)
        assert member._offsets[tp].position().offset == message.offset + 1


async def test_a_due_retry_copy_goes_ahead_of_the_buffer_on_an_unordered_lane(
    transport: Transport, unique: str
) -> None:
    """A retry copy whose delay is over does not wait behind every message the member holds.

    One handler at a time on an unordered lane: the first message fails once, 600 more (2 ms
    each) fill the member's buffer. The copy, due 200 ms after the failure, runs while the
    buffer is still draining: at least 100 of those messages run after it. Queued at the back
    of the keys waiting for a worker, it would run after every message buffered before it
    came back from its tier.
    """
    spec = lane_spec(f"ahead_{unique}", 1, ordered=False, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    app = App([spec])
    ran: list[tuple[bytes, int]] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        ran.append((event, ctx.attempt))
        if event == b"first" and ctx.attempt == 1:
            raise RuntimeError("upstream 503")
        await asyncio.sleep(0.002)

    backlog = [Record(b"b%d" % i, b"k%d" % i) for i in range(600)]
    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"first", b"k-first"), *backlog])
    await producer.close()
    settings = FAST.model_copy(update={"max_concurrency": 1})
    member = Member(app, transport, f"g-{unique}", settings)
    async with running(member):
        await eventually(lambda: member.stats.handled == 601)
    copy = ran.index((b"first", 2))
    assert len(ran) - 1 - copy >= 100, f"the copy ran {copy}th of {len(ran)}"


async def test_the_debug_delivery_line_has_the_key_as_text_and_the_tenant(
    transport: Transport, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The ``delivery`` line's key is decoded (base64 when not text) and its tenant is there.

    Before, the key was the raw bytes (``"b'c1'"`` in JSON logs) and the tenant was missing,
    against the fields docs/glossary.md lists.
    """
    spec = lane_spec(f"deliverylog_{unique}", 1)
    await declare(transport, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        """Nothing: the line is what is looked at."""

    producer = transport.producer()
    await producer.send_many(
        spec.name,
        [Record(b"1", b"c1", {h.TENANT: b"acme"}), Record(b"2", b"\xff\xfe"), Record(b"3")],
    )
    await producer.close()
    caplog.set_level(logging.DEBUG, logger="pipeline.runtime.member")
    member = Member(app, transport, f"g-{unique}", FAST)
    async with running(member):
        await eventually(lambda: member.stats.handled == 3)
    lines = [
        json.loads(JsonFormatter().format(r))
        for r in caplog.records
        if r.name == "pipeline.runtime.member" and r.getMessage() == "delivery"
    ]
    assert [(line["key"], line["tenant"]) for line in lines] == [
        ("c1", "acme"),
        ("//4=", None),
        (None, None),
    ]


async def test_a_retryable_function_that_raises_leaves_no_message_stuck(
    transport: Transport, unique: str
) -> None:
    """An ``App(retryable=...)`` that raises falls back to the default rule, once per failure."""
    spec = lane_spec(f"rtyraise_{unique}", 1, retry={"tiers": ["100ms"]})
    await declare(transport, spec)

    def retryable(error: BaseException) -> bool:
        return error.args[0].status == 503  # type: ignore[no-any-return] # a bug: no .status

    app = App([spec], retryable=retryable)
    attempts: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise Retry("upstream 503")

    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"v", b"k")])
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST)
    async with running(member):
        await eventually(lambda: member.stats.handled == 1, timeout_s=20)
    assert attempts == [1, 2]
    assert member.stats.retried == 1
    lag = await transport.admin().group_lag(f"g-{unique}", spec.name)
    assert [p.committed for p in lag] == [1]
