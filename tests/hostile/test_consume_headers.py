"""Garbled ``pl-*`` headers written by any producer, consumed by a real member on both brokers.

Each message must be processed or dead-lettered with a reason, and the member keeps going: a
message that neither ends nor is routed holds its partition's committed position for good.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

from contract.helpers import consume_until, wait_for
from logstore.helpers import FakeClock, new_row, real_log_store
from redis.asyncio import Redis
from runtime.helpers import (
    FAST,
    declare,
    eventually,
    handled_by_a_member,
    lane_spec,
    produce,
    running,
)

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

CENTURY_MS = 100 * 365 * 86_400_000


async def test_a_negative_attempt_is_counted_as_a_first_attempt(
    transport: Transport, unique: str, redis: Redis
) -> None:
    """A failing message with ``pl-attempt: -1`` goes through the tiers and ends in the DLQ."""
    spec = lane_spec(f"neg_{unique}", 1, retry={"tiers": ["100ms"], "max_attempts": 2})
    await declare(transport, spec)
    app = App([spec])
    attempts: dict[bytes, list[int]] = defaultdict(list)

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        attempts[event].append(ctx.attempt)
        raise RuntimeError("upstream 503")

    records = [Record(b"neg", b"k1", {h.ATTEMPT: b"-1"}), Record(b"zero", b"k2", {h.ATTEMPT: b"0"})]
    await produce(transport, spec.name, records)
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: member.stats.dead_lettered == 2)
    assert attempts == {b"neg": [1, 2], b"zero": [1, 2]}
    dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
    dead = await consume_until(dlq, lambda got: len(got) >= 2)
    await dlq.close()
    assert sorted((m.value, m.headers[h.DEAD_REASON], m.headers[h.ATTEMPT]) for m in dead) == [
        (b"neg", b"exhausted", b"2"),
        (b"zero", b"exhausted", b"2"),
    ]


async def test_an_origin_header_that_is_not_utf8_does_not_stop_its_message(
    transport: Transport, unique: str, redis: Redis
) -> None:
    """A message whose ``pl-origin-*`` headers are not UTF-8 is handled like any other."""
    spec = lane_spec(f"orig_{unique}", 1, retry={"tiers": ["100ms"]})
    garbled = {h.ORIGIN_TOPIC: b"\xff\xfe", h.ORIGIN_PARTITION: b"\xc3(", h.ORIGIN_OFFSET: b"x"}
    records = [Record(b"garbled", b"k", garbled), Record(b"next", b"k")]
    handled = await handled_by_a_member(transport, redis, unique, spec, {spec.name: records}, 2)
    assert handled == [b"garbled", b"next"]


async def test_a_retry_copy_due_in_a_century_waits_no_longer_than_its_tier(
    transport: Transport, unique: str, redis: Redis
) -> None:
    """A copy in a retry tier whose ``pl-due-ms`` is 100 years ahead runs after the tier's delay."""
    spec = lane_spec(f"due_{unique}", 1, retry={"tiers": ["200ms"]})
    far = str(int(time.time() * 1000) + CENTURY_MS).encode()
    copies = [
        Record(b"far", b"k", {h.DUE_MS: far, h.ATTEMPT: b"2"}),
        Record(b"year-1e9", b"j", {h.DUE_MS: b"3" * 20}),
    ]
    sends = {spec.retry_topic_names()[0]: copies}
    handled = await handled_by_a_member(transport, redis, unique, spec, sends, 2, timeout_s=30)
    assert sorted(handled) == [b"far", b"year-1e9"]


async def test_a_row_id_postgresql_cannot_store_does_not_keep_other_rows_unprocessed(
    transport: Transport, unique: str, postgres_service: str, tmp_path: Path
) -> None:
    """A ``pl-row-id`` with a NUL byte (or not UTF-8) is ignored; the other rows are marked."""
    spec = lane_spec(f"rows_{unique}", 1)
    await declare(transport, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        pass

    async with real_log_store("postgres", tmp_path, postgres_service) as store:
        row = new_row(1, FakeClock(time.time()))
        await store.insert(row)
        records = [
            Record(b"nul", b"a", {h.ROW_ID: b"bad\x00id"}),
            Record(b"binary", b"b", {h.ROW_ID: b"\xff\xfe"}),
            Record(b"real", b"c", {h.ROW_ID: row.id.encode()}),
        ]
        await produce(transport, spec.name, records)
        member = Member(app, transport, f"g-{unique}", FAST, processed=store)
        async with running(member):
            await eventually(lambda: member.stats.handled == 3)

            async def marked() -> bool:  # at the commit tick that commits its message
                found = await store.get(row.id)
                return found is not None and found.state == "processed"

            await wait_for(marked)
