"""A dependency's odd Retry-After (NaN, infinite, negative) on a lane with an adaptive key."""

from __future__ import annotations

import math

import pytest
from runtime.helpers import FAST, declare, eventually, running, vision_lane
from support import own_throttle

from pipeline import headers as h
from pipeline.admission.adaptive import feedback_for
from pipeline.admission.throttle import Throttle
from pipeline.envelope import Message, Record
from pipeline.errors import Throttled
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.spec import AdaptivePolicy
from pipeline.transport.protocol import Transport

pytestmark = pytest.mark.redis

POLICY = AdaptivePolicy.model_validate({"min": 1, "max": 8, "cooldown": "1h"})


throttle = own_throttle(default_limit=2)
"""A started throttle in a namespace of the test's own: two slots per tenant."""


@pytest.mark.parametrize("retry_after_s", [math.nan, math.inf, -math.inf, -5.0])
def test_a_retry_after_that_is_no_time_closes_nothing(retry_after_s: float) -> None:
    """A Retry-After that is not a finite time (NaN, infinite) or is negative closes nothing."""
    (feedback,) = feedback_for(
        ["dep:vision"],
        {"dep:vision": POLICY},
        duration_s=0.1,
        throttled=True,
        retry_after_s=retry_after_s,
    )
    assert (feedback.outcome, feedback.retry_after_ms) == ("throttled", 0)


async def test_a_nan_retry_after_is_retried_and_the_slot_returned(
    transport: Transport, throttle: Throttle, unique: str
) -> None:
    """``Throttled(retry_after_s=float("nan"))`` is retried like any 429 and frees its slots."""
    spec = vision_lane(f"thrnan_{unique}", max_attempts=3)
    await declare(transport, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        if ctx.attempt == 1:
            raise Throttled(retry_after_s=float("nan"), dependency="vision")

    await throttle.set_limit("dep:vision", 1)
    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"{}", b"k0", headers={h.TENANT: b"acme"})])
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST, throttle=throttle)
    async with running(member):
        await eventually(lambda: member.stats.handled == 1)
    assert member.stats.retried == 1
    assert not (await throttle.status("dep:vision")).holders
