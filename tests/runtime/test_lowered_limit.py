"""A lowered concurrency limit holds at once, also on a member whose workers wait for work."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from pipeline.envelope import Message
from pipeline.runtime import App, Context
from pipeline.runtime.lanes import KeyLanes
from pipeline.testing import TestApp
from pipeline.topics.spec import TopicSpec


class Job(BaseModel):
    """A job of one key."""

    job_id: str


async def test_an_idle_member_runs_no_more_handlers_than_its_lowered_limit() -> None:
    """Lowered to 4 while idle (as the pressure governor does), a member starts 4 of 8 jobs."""
    app = App([TopicSpec.model_validate({"name": "jobs", "partitions": 4})])

    @app.handler("jobs")
    async def handle(event: Job, ctx: Context) -> None:
        await asyncio.sleep(10)

    async with TestApp(app) as t:
        assert t.settings.runtime.max_concurrency >= 8
        t.member._set_limit(4)
        for i in range(8):
            await t.send("jobs", Job(job_id=f"j{i}"), key=f"j{i}")
        await t.drain()
        assert len(t.handled("jobs")) == 8
        assert t.peak_concurrency("jobs") == 4


async def test_a_worker_over_the_lowered_limit_leaves_the_key_at_its_head() -> None:
    """Workers woken over the limit start nothing, and each key's messages still run in order."""
    order: list[int] = []
    running = 0
    peak = 0
    gate, two = asyncio.Event(), asyncio.Event()

    async def process(m: Message) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 2:
            two.set()
        if m.offset >= 0:
            await gate.wait()
            order.append(m.offset)
        running -= 1

    lanes = KeyLanes(process, max_concurrency=8)
    lanes.start()
    lanes.submit(Message("t", 0, -1, b"warm-up", b""), ordered=True)
    await asyncio.wait_for(lanes.wait_idle(), 10)  # every worker now waits for work
    lanes.limit = 2
    for i in range(16):
        lanes.submit(Message("t", 0, i, f"k{i % 4}".encode(), b""), ordered=True)
    await asyncio.wait_for(two.wait(), 10)
    gate.set()
    await asyncio.wait_for(lanes.wait_idle(), 10)
    await lanes.close()
    assert peak == 2
    for k in range(4):
        assert [o for o in order if o % 4 == k] == list(range(k, 16, 4))
    assert len(order) == 16
