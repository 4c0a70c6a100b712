"""The demo's audit counts a follower held behind a parked key as waiting, not as lost.

On an ordered lane with retry tiers, a message whose key has an earlier message in a retry tier
is held in Redis (its offset committed): it is in no topic. A short ``make demo`` ends with the
messages lane's heads in its 1 min or 10 min tier, and their followers were counted as lost
("lost 3" with 654 in retry), although the member runs them once their head finishes.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce

import demo.__main__ as demo_main
from demo.audit import GroupTopics, audit
from demo.held import held_rows
from demo.stats import Collector
from demo.summary import Snapshot, lost_line, summary
from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.logstore import NewRow, RowState
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.retry.guard_store import lane_guards
from pipeline.retry.keys import encode_key
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

pytestmark = pytest.mark.redis


def _row(row_id: str, event_id: str, topic: str, received_at_ms: int) -> NewRow:
    return NewRow(
        id=row_id,
        source="demo",
        tenant="tenant-04",
        key="tenant-04-c5",
        topic=topic,
        lane=topic,
        event_id=event_id,
        received_at_ms=received_at_ms,
        headers={},
        body=b"{}",
    )


async def test_a_follower_held_behind_a_parked_key_is_in_retry_not_lost(
    streams: Transport, redis: Redis, unique: str, tmp_path: Path
) -> None:
    """Head in a 1 min tier, follower held in Redis: both in retry, none lost."""
    spec = lane_spec(f"held_{unique}", 1, ordered=True, retry={"tiers": ["1m"]})
    await declare(streams, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"head":
            raise RuntimeError("provider asked us to slow down")  # retried in a minute

    since_ms = int(time.time() * 1000)
    store = SqliteLogStore(tmp_path / "ingress.db")
    await store.open()
    try:
        for row, event in (("row-head", "e-head"), ("row-next", "e-next")):
            await store.insert(_row(row, event, spec.name, since_ms + 1))
        await store.mark_produced(["row-head", "row-next"])
        key = b"tenant-04-c5"
        await produce(
            streams,
            spec.name,
            [
                Record(b"head", key, {h.ROW_ID: b"row-head", h.EVENT_ID: b"e-head"}),
                Record(b"next", key, {h.ROW_ID: b"row-next", h.EVENT_ID: b"e-next"}),
            ],
        )
        prefix, group = f"t{unique}", f"g-{unique}"
        member = Member(app, streams, group, FAST, redis=redis, redis_prefix=prefix)
        held_hash = lane_guards(redis, prefix, [spec])[spec.lane].keys.of_key(encode_key(key))[2]
        stop, hurry = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(member.run(stop, hurry))
        try:
            await eventually(lambda: member.stats.parked == 1)  # the follower is held
        finally:
            stop.set()
            hurry.set()
            await asyncio.wait_for(task, 60)

        assert await redis.hlen(held_hash) == 1  # its only copy, its offset committed
        held = await held_rows(redis, prefix, [spec.lane])
        groups = {group: GroupTopics(spec.name, tuple(spec.retry_topic_names()))}
        found = await audit(streams, store, since_ms, groups, held=held)
    finally:
        await store.close()

    assert held == {"row-next"}
    assert (found.unfinished, found.in_retry, found.held, found.waiting) == (2, 2, 1, 0)
    snapshot = Snapshot(
        transport="redis",
        elapsed_s=1.0,
        duration_s=1.0,
        phase="done",
        traffic={"accepted": 2},
        rows={RowState.PRODUCED: 2},
        dead_lettered=0,
        retried=1,
        in_retry=1,
        collector=Collector(start_ms=since_ms),
        audit=found,
    )
    data = summary(snapshot)
    assert (data["in_retry"], data["lost"], data["audit_complete"]) == (2, 0, True)
    assert lost_line(data, tmp_path) is None


def test_a_run_that_lost_events_exits_non_zero_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m demo`` ends with status 1 and one line saying what was lost and where to look."""
    lost = {"interrupted": False, "lost": 3, "audit_complete": True}

    class LosingRun:
        def __init__(self, options: object) -> None:
            del options

        async def run(self) -> dict[str, object]:
            return lost

    monkeypatch.setattr(demo_main, "Demo", LosingRun)
    output = tmp_path / "out"
    assert demo_main.main(["--output", str(output), "--headless"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: lost 3 accepted webhook(s) (property P1)")
    for where in ("ingress.db", "logs", "summary.json"):
        assert str(output.resolve() / where) in line

    lost.update(lost=0)
    assert demo_main.main(["--output", str(output), "--headless"]) == 0
    lost.update(lost=None, audit_complete=False)  # unknown (no complete audit): not an error
    assert demo_main.main(["--output", str(output), "--headless"]) == 0
    assert capsys.readouterr().err == ""
