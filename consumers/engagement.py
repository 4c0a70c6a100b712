"""Example consumer group for the ``engagement`` lane (topics/engagement.yaml).

Run one or more members:

    pipeline topics apply
    pipeline consume consumers.engagement:app --group engagement

Comments, likes and mentions arrive in storms: one viral post can send thousands in a minute.
Their order does not matter (``ordered: false``), so every event runs concurrently. Each tenant's
share of the lane is bounded by the lane's per-tenant budget (the ``throttle:`` declaration in the
yaml file, applied by the runtime before the handler is called), so one tenant's storm waits in
its own line instead of in front of everyone else's.

The handler classifies the event with a simulated moderation service (about 40 ms).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random

from pydantic import BaseModel

from pipeline.errors import DeadLetter
from pipeline.runtime import App, Context

log = logging.getLogger(__name__)
app = App("topics")

_MEDIAN_LATENCY_S = 0.04
_LATENCY_SIGMA = 0.4


class EngagementEvent(BaseModel):
    """A comment, like or mention on a tenant's page."""

    conversation_id: str
    kind: str
    text: str = ""


async def moderate(text: str) -> bool:
    """Pretend to call a moderation service; True when the text may be shown."""
    await asyncio.sleep(_MEDIAN_LATENCY_S * math.exp(random.gauss(0.0, _LATENCY_SIGMA)))
    return "spam" not in text


@app.handler("engagement")
async def handle(event: EngagementEvent, ctx: Context) -> None:
    """Moderate one engagement event; spam is dead-lettered for a person to look at."""
    if not await moderate(event.text):
        raise DeadLetter("flagged as spam")
    log.debug("%s on %s (tenant %s) accepted", event.kind, event.conversation_id, ctx.tenant)
