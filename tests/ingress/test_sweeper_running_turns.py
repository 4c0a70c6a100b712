"""The sweeper does not replay a webhook whose debounced turn is still running on a member."""

from __future__ import annotations

import asyncio
import json

from ingress.helpers import QUICK, ticks
from logstore.helpers import FakeClock, new_row
from redis.asyncio import Redis
from runtime.helpers import declare, eventually, lane_spec, running

from pipeline.config import IngressSettings, SweeperSettings
from pipeline.ingress import headers as h
from pipeline.ingress.service import build_sweeper
from pipeline.logstore import LogStore, RowState
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

QUIET = {"key": "conversation_id", "quiet_s": 0.05, "max_wait_s": 1, "max_batch": 50}


async def test_a_turn_running_past_patience_is_not_replayed_while_it_runs(
    streams: Transport, redis: Redis, store: LogStore, clock: FakeClock, unique: str
) -> None:
    """A debounced turn that outlasts the sweeper's patience keeps its rows alive each tick."""
    spec = lane_spec(f"chats_{unique}", 1, debounce=QUIET)
    await declare(streams, spec)
    app = App([spec])
    started, finish = asyncio.Event(), asyncio.Event()

    @app.handler(spec.lane)
    async def handle(events: list[bytes], ctx: Context) -> None:
        started.set()
        await finish.wait()  # a long answer to the conversation

    row = new_row(1, clock, topic=spec.name, lane=spec.lane)
    await store.insert(row)
    await store.mark_produced([row.id])
    body = json.dumps({"conversation_id": "c1"}).encode()
    await streams.producer().send(spec.name, body, key=b"c1", headers={h.ROW_ID: row.id.encode()})
    group = f"g-{unique}"
    sweeper = build_sweeper(
        store,
        streams.producer(),
        streams.admin(),
        [spec],
        IngressSettings(sweeper=SweeperSettings(lane_groups={spec.lane: group})),
        clock=clock,
    )
    member = Member(
        app, streams, group, QUICK, processed=store, redis=redis, redis_prefix=f"t{unique}"
    )
    async with running(member):
        await started.wait()
        await eventually(lambda: member._committed != {})  # its offset committed: no lag
        clock.advance(1000)  # past patience plus the window, and past max_patience_s (900 s)
        await ticks(member, 2)
        report = await sweeper.sweep_once()
        assert report.replayed == 0
        got = await store.get(row.id)
        assert got is not None
        assert (got.state, got.replay_count) == (RowState.PRODUCED, 0)
        finish.set()
        await eventually(lambda: member.stats.handled == 1)
        await ticks(member, 2)
    got = await store.get(row.id)
    assert got is not None
    assert got.state == RowState.PROCESSED
