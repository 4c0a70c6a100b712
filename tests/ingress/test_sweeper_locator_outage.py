"""The sweeper still leaves a webhook whose event waited in its buffer through a long outage.

The debouncer finds a buffered event by its locator (``{P:deb:LANE}:e:EVENT``); a locator that
expired while its event still waited (ingress and members down overnight, a turn failing for
hours) had the returning sweeper told "not held": it replayed the row and, after
``max_replays``, abandoned it at CRITICAL while its turn was still to come. Time is moved on
in Redis instead of waited for: every key of the lane whose expiry falls within the outage is
removed, as Redis would by then, and the others' expiries are shortened by it.
"""

from __future__ import annotations

import json
import logging

import pytest
from logstore.helpers import FakeClock, new_row
from redis.asyncio import Redis
from runtime.helpers import declare, lane_spec
from support import pass_expiries

from pipeline.admission.debounce import Debouncer
from pipeline.admission.debounce import keys as debounce_keys
from pipeline.config import IngressSettings, Settings, SweeperSettings
from pipeline.envelope import Message
from pipeline.ingress import headers as h
from pipeline.ingress.service import build_sweeper
from pipeline.logstore import LogStore, RowState
from pipeline.transport.protocol import Transport

WINDOW = {"key": "conversation_id", "quiet_s": 60, "max_wait_s": 120, "max_batch": 100}
OUTAGE_S = 12 * 3600  # ingress and members down overnight
SWEEP_GAP_S = 2_000  # past patience (300 s) plus the window (120 s), and max_patience_s
EVENTS = 70  # more than the 64 a conversation's state remembers


async def outage(redis: Redis, prefix: str, lane: str, duration_ms: int) -> None:
    """Move the lane's keys ``duration_ms`` on: each whose expiry falls within it is gone."""
    await pass_expiries(redis, f"{debounce_keys.lane_tag(prefix, lane)}*", duration_ms)


@pytest.mark.parametrize("turn", ["waiting", "failing"])
async def test_rows_whose_events_waited_through_an_outage_are_neither_replayed_nor_abandoned(
    streams: Transport,
    redis: Redis,
    store: LogStore,
    clock: FakeClock,
    settings: Settings,
    unique: str,
    caplog: pytest.LogCaptureFixture,
    turn: str,
) -> None:
    """70 rows whose events still wait after a night without the ingress are all left."""
    spec = lane_spec(f"chats_{unique}", 1, debounce=WINDOW)
    prefix = f"t{unique}"
    await declare(streams, spec)
    assert spec.debounce is not None
    debouncer = Debouncer(redis, prefix, spec.lane, spec.debounce)
    body = json.dumps({"conversation_id": "c1"}).encode()
    rows = []
    for n in range(EVENTS):
        row = new_row(n, clock, topic=spec.name, lane=spec.lane)
        await store.insert(row)
        await store.mark_produced([row.id])
        headers = {h.ROW_ID: row.id.encode(), h.EVENT_ID: row.event_id.encode()}
        message = Message(spec.name, 0, n, b"c1", body, headers, 1)
        assert await debouncer.record("c1", message) > 0
        rows.append(row)
    if turn == "failing":  # its turn ran and failed, and keeps failing: it stays buffered
        due = debounce_keys.due_key(prefix, spec.lane)
        await redis.zadd(due, {"c1": 0})
        (claimed,) = (await debouncer.claim(10)).turns
        assert await debouncer.finish(claimed, ok=False, retry_in_ms=3_600_000) == "scheduled"
    await outage(redis, prefix, spec.lane, OUTAGE_S * 1000)
    clock.advance(OUTAGE_S)
    redis_settings = settings.redis.model_copy(update={"key_prefix": prefix})
    ingress = IngressSettings(sweeper=SweeperSettings(lane_groups={spec.lane: "g-none"}))
    sweeper = build_sweeper(
        store,
        streams.producer(),
        streams.admin(),
        [spec],
        ingress,
        clock=clock,
        redis=redis_settings,
    )
    try:
        for _ in range(SweeperSettings().max_replays + 2):
            await sweeper.sweep_once()
            await outage(redis, prefix, spec.lane, SWEEP_GAP_S * 1000)
            clock.advance(SWEEP_GAP_S)
    finally:
        await sweeper.close()
    assert (sweeper.totals.replayed, sweeper.totals.abandoned) == (0, 0)
    for row in rows:
        got = await store.get(row.id)
        assert got is not None
        assert (got.state, got.replay_count) == (RowState.PRODUCED, 0)
    assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL]
