"""A member's revocation never loses the cancellation of the poll it runs in."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest
from runtime.helpers import FAST, lane_spec

from pipeline.envelope import TopicPartition
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


@pytest.mark.parametrize("transport", ["redis"], indirect=True)
async def test_a_revocation_cancelled_as_its_runs_end_is_cancelled(
    transport: Transport, unique: str
) -> None:
    """A revocation cancelled in the loop turn in which its partition's runs end still stops.

    On Redis Streams a revocation runs inside the poll, and at shutdown the member cancels the
    poll that keeps it in its group while it drains, once, then waits for it without bound. The
    revocation waited for its partition's runs under ``asyncio.wait_for``, which on Python 3.11
    returns and drops a cancellation that lands once the awaited thing is done (CPython issue
    86296): the revocation went on, the poll returned, and that loop polled for ever, so the
    member never exited.
    """
    spec = lane_spec(f"revoke_{unique}", 1)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        pass

    member = Member(app, transport, f"g-{unique}", FAST)
    lanes = member._chain.lanes
    wait_idle = lanes.wait_idle
    revoking: asyncio.Task[object] | None = None

    async def runs_end_and_poll_stops(partitions: Iterable[TopicPartition] | None = None) -> None:
        await wait_idle(partitions)
        assert revoking is not None
        revoking.cancel()  # the shutdown's stop of its poll, in the turn the runs ended

    lanes.wait_idle = runs_end_and_poll_stops  # type: ignore[method-assign]
    tp = TopicPartition(spec.name, 0)
    revoking = asyncio.create_task(member.on_revoked([tp], lost=False))
    await asyncio.wait({revoking})
    assert revoking.cancelled()
