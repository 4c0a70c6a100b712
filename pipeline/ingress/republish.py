"""Producing stored rows again (sweeper and replay): grouped per topic, failures isolated."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline import tracing
from pipeline.envelope import Record
from pipeline.errors import MessageTooLarge, PipelineError
from pipeline.ingress.headers import event_headers, event_key
from pipeline.logstore import LogRow
from pipeline.transport.protocol import Producer


@dataclass(slots=True)
class Produced:
    """The outcome of one :func:`produce_rows` call."""

    delivered: list[LogRow] = field(default_factory=list)
    failed: list[tuple[LogRow, PipelineError]] = field(default_factory=list)


async def produce_rows(producer: Producer, rows: Sequence[LogRow], *, replay: bool) -> Produced:
    """Produce ``rows`` (one ``send_many`` per topic); ``replay`` marks the copies as replays.

    The ``replay-count`` header is the row's count, plus one when ``replay`` is set: what the
    row's counter becomes once a sweeper replay is recorded (a replay by hand sets the counter
    back to 0, so the sweeper's budget starts again, and its copy still says it is a replay).
    """
    by_topic: dict[str, list[LogRow]] = defaultdict(list)
    for row in rows:
        by_topic[row.topic].append(row)
    outcome = Produced()
    results = await asyncio.gather(
        *(_topic(producer, topic, group, replay=replay) for topic, group in by_topic.items())
    )
    for part in results:
        outcome.delivered += part.delivered
        outcome.failed += part.failed
    return outcome


async def _topic(producer: Producer, topic: str, rows: list[LogRow], *, replay: bool) -> Produced:
    records = [
        Record(row.body, event_key(row), event_headers(row, row.replay_count + int(replay)))
        for row in rows
    ]
    sends = tracing.sends_started(topic, records)
    try:
        await producer.send_many(topic, records)
    except MessageTooLarge as exc:
        tracing.sends_ended(sends, exc)
        if len(rows) == 1:
            return Produced(failed=[(rows[0], exc)])
        # Find the culprit: produce one by one, so one bad row does not hold back the rest.
        parts = await asyncio.gather(
            *(_one(producer, topic, row, record) for row, record in zip(rows, records, strict=True))
        )
        outcome = Produced()
        for part in parts:
            outcome.delivered += part.delivered
            outcome.failed += part.failed
        return outcome
    except PipelineError as exc:
        tracing.sends_ended(sends, exc)
        return Produced(failed=[(row, exc) for row in rows])
    tracing.sends_ended(sends)
    return Produced(delivered=list(rows))


async def _one(producer: Producer, topic: str, row: LogRow, record: Record) -> Produced:
    try:
        await producer.send_many(topic, [record])
    except PipelineError as exc:
        return Produced(failed=[(row, exc)])
    return Produced(delivered=[row])
