"""A member started before `pipeline topics apply`: one error, no retried poll warning."""

from __future__ import annotations

import asyncio
import logging

import pytest
from runtime.helpers import FAST, lane_spec

from pipeline.errors import UnknownTopic
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


def _undeclared_member(transport: Transport, unique: str) -> Member:
    """A member of a lane whose topics were never applied."""
    spec = lane_spec(f"undeclared_{unique}", 1)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        del event, ctx

    return Member(app, transport, f"g-{unique}", FAST)


async def test_undeclared_lane_stops_the_member_without_a_shutdown_poll_warning(
    transport: Transport, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The missing topic ends the run as UnknownTopic and shutdown does not log it as retriable."""
    member = _undeclared_member(transport, unique)
    caplog.set_level(logging.WARNING, logger="pipeline.runtime.member")
    with pytest.raises(UnknownTopic, match=f"undeclared_{unique}"):
        await asyncio.wait_for(member.run(asyncio.Event()), 60)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_shutdown_polling_ends_on_an_undeclared_topic(
    transport: Transport, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Polling through shutdown stops at UnknownTopic (what stopped the member) without a word."""
    member = _undeclared_member(transport, unique)
    consumer = transport.consumer(member.group, [f"undeclared_{unique}"], listener=member)
    caplog.set_level(logging.WARNING, logger="pipeline.runtime.member")
    try:
        await asyncio.wait_for(member._keep_polling(consumer), 30)  # before: retried forever
    finally:
        await consumer.close()
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
