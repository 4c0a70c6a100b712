"""The sweeper does not replay a webhook whose long work is still running on a member."""

from __future__ import annotations

import asyncio

from ingress.helpers import QUICK, ticks
from logstore.helpers import FakeClock, new_row
from runtime.helpers import declare, eventually, held_app, lane_spec, running

from pipeline.config import IngressSettings, SweeperSettings
from pipeline.ingress import headers as h
from pipeline.ingress.service import build_sweeper
from pipeline.ingress.sweeper import Sweeper
from pipeline.logstore import LogRow, LogStore, RowState
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport


async def test_a_long_run_past_the_overdue_bound_is_not_replayed_while_it_runs(
    streams: Transport, store: LogStore, clock: FakeClock, unique: str
) -> None:
    """A row whose long work runs past max_patience_s shows life through its member's ticks."""
    spec = lane_spec(f"jobs_{unique}", 1, heartbeat_timeout="1h")
    await declare(streams, spec)
    app, started, finish = held_app(spec)  # each run a 20-minute render, until finish is set
    row, sweeper, member = await render_run(streams, store, clock, app, spec, unique)
    async with running(member):
        await started.wait()
        clock.advance(1000)  # past max_patience_s (900 s) since it was produced
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


async def test_a_long_run_whose_member_stopped_is_replayed_after_patience(
    streams: Transport, store: LogStore, clock: FakeClock, unique: str
) -> None:
    """A run that no member shows alive any more is replayed once its bound passed again."""
    spec = lane_spec(f"jobs_{unique}", 1, heartbeat_timeout="1h")
    await declare(streams, spec)
    app = App([spec])
    started = asyncio.Event()

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        started.set()
        await asyncio.Event().wait()  # never ends: its member stops under it

    _, sweeper, member = await render_run(streams, store, clock, app, spec, unique)
    async with running(member):
        await started.wait()
        clock.advance(1000)
        await ticks(member, 2)
    assert (await sweeper.sweep_once()).replayed == 0
    clock.advance(901)  # the lane is backed up (its message was never committed)
    report = await sweeper.sweep_once()
    assert report.replayed == 1


async def render_run(
    redis: Transport, store: LogStore, clock: FakeClock, app: App, spec: TopicSpec, unique: str
) -> tuple[LogRow, Sweeper, Member]:
    """A row of ``spec``'s lane produced to it, the lane's sweeper, and a member of g-<unique>."""
    row = new_row(1, clock, topic=spec.name, lane=spec.lane)
    await store.insert(row)
    await store.mark_produced([row.id])
    await redis.producer().send(spec.name, b"render", key=b"k", headers={h.ROW_ID: row.id.encode()})
    group = f"g-{unique}"
    sweeper = sweeper_of(store, redis, spec.lane, spec.name, group, clock)
    return row, sweeper, Member(app, redis, group, QUICK, processed=store)


def sweeper_of(
    store: LogStore, redis: Transport, lane: str, topic: str, group: str, clock: FakeClock
) -> Sweeper:
    """The sweeper of ``lane`` (read by ``group``) with the default patience, on ``clock``."""
    return build_sweeper(
        store,
        redis.producer(),
        redis.admin(),
        [lane_spec(topic, 1, lane=lane, heartbeat_timeout="1h")],
        IngressSettings(sweeper=SweeperSettings(lane_groups={lane: group})),
        clock=clock,
    )
