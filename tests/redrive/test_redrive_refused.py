"""Redrive of dead letters the origin topic refuses, and of those it leaves: a line for each."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redrive.helpers import dead_letter_lane
from runtime.helpers import declare, lane_spec, produce

from pipeline import headers as h
from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.redrive.redrive import Redrive
from pipeline.redrive.select import Selection
from pipeline.transport import create_transport
from pipeline.transport.protocol import TopicConfig, Transport


async def test_a_dead_letter_too_large_for_its_origin_stays_and_the_rest_move_once(
    transport: Transport, settings: Settings, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One dead letter its origin refuses as too large is left with a line; the others move once.

    Before, the run failed on it every time it was run again, never moving what came after it,
    and on Kafka sent again, at each try, what the broker had taken of the failed batch.
    """
    spec, dlq, headers = await dead_letter_lane(transport, unique, 4)
    small = [Record(b"v%d" % i, b"k%d" % i, {**headers, h.EVENT_ID: b"e%d" % i}) for i in range(20)]
    if transport.name == "kafka":  # the origin now takes less than the dead-letter topic
        await transport.admin().update_topic(
            TopicConfig(spec.name, 4, configs={"max.message.bytes": "3000"})
        )
        big = Record(b"x" * 5_000, b"k3", headers)
        await produce(transport, dlq, [*small[:10], big, *small[10:]])
    else:  # an entry larger than this deployment's producers take (another client's XADD)
        big = Record(b"x" * (settings.max_message_bytes + 1), b"k3", headers)
        larger = settings.model_copy(update={"max_message_bytes": 4 * settings.max_message_bytes})
        writer = create_transport(larger, "redis")
        try:
            await produce(writer, dlq, [*small[:10], big, *small[10:]])
        finally:
            await writer.close()
    with caplog.at_level(logging.WARNING, logger="pipeline.redrive"):
        report = await asyncio.wait_for(Redrive(transport, dlq, Selection()).run(), 60)
    assert (report.scanned, report.moved, report.too_large) == (21, 20, 1)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("pipeline.redrive")]
    assert len(lines) == 1, lines
    assert f"{dlq}[" in lines[0]
    assert "too large" in lines[0]
    assert "left in the DLQ" in lines[0]
    again = await asyncio.wait_for(Redrive(transport, dlq, Selection()).run(), 60)
    assert again.scanned == 0
    counts = await transport.admin().list_topics([spec.name])
    assert counts[spec.name].message_count == 20


async def test_each_dead_letter_left_behind_gets_a_line_saying_why(
    transport: Transport, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No origin, a gone origin, redriven too often: each left entry is named, with what to do."""
    spec = lane_spec(f"rd_{unique}", 2)
    await declare(transport, spec)
    dlq = spec.dead_letter
    fatal = {h.DEAD_REASON: b"fatal"}
    records = [
        Record(b"v0", b"k0", {**fatal, h.ORIGIN_TOPIC: spec.name.encode()}),
        Record(b"v1", b"k1", fatal),
        Record(b"v2", b"k2", {**fatal, h.ORIGIN_TOPIC: f"gone_{unique}".encode()}),
        Record(b"v3", b"k3", {**fatal, h.ORIGIN_TOPIC: b"\xff\xfe"}),
        Record(b"v4", b"k4", {**fatal, h.ORIGIN_TOPIC: spec.name.encode(), h.REDRIVE_COUNT: b"3"}),
    ]
    await produce(transport, dlq, records)
    with caplog.at_level(logging.WARNING, logger="pipeline.redrive"):
        report = await asyncio.wait_for(Redrive(transport, dlq, Selection()).run(), 60)
    assert (report.moved, report.no_origin, report.refused_loops) == (1, 3, 1)
    lines = sorted(r.getMessage() for r in caplog.records if r.name.startswith("pipeline.redrive"))
    assert len(lines) == 4, lines
    by_key = {
        key: next(line for line in lines if f"key b'{key}'" in line)
        for key in ("k1", "k2", "k3", "k4")
    }
    assert all(f"{dlq}[" in line and "left in the DLQ" in line for line in lines)
    assert "no pl-origin-topic" in by_key["k1"]
    assert f"gone_{unique}" in by_key["k2"]
    assert all("--to" in by_key[key] for key in ("k1", "k2", "k3"))
    assert "--max-redrives" in by_key["k4"]
