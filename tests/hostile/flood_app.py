"""An app of two lanes for a flood of distinct keys, tenants and conversations (by hand).

``FLOOD_UNIQUE`` names the lanes: ``flood_thr_UNIQUE`` is throttled per tenant
(``org:{tenant}``), ordered, with a retry tier, and a fifth of its messages fail once;
``flood_deb_UNIQUE`` is debounced per conversation, with a retry tier. ``flood_rss.py``
measures a ``pipeline consume`` process of it.
"""

from __future__ import annotations

import json
import os

from pipeline.errors import Retry
from pipeline.runtime import App, Context
from pipeline.topics.spec import TopicSpec

UNIQUE = os.environ["FLOOD_UNIQUE"]
THROTTLED = TopicSpec.model_validate(
    {
        "name": f"flood_thr_{UNIQUE}",
        "partitions": 3,
        "throttle": {"keys": ["org:{tenant}"]},
        "retry": {"tiers": ["100ms"], "max_attempts": 3},
    }
)
DEBOUNCED = TopicSpec.model_validate(
    {
        "name": f"flood_deb_{UNIQUE}",
        "partitions": 3,
        "debounce": {"key": "conversation_id", "quiet_s": 0.1, "max_wait_s": 1},
        "retry": {"tiers": ["100ms"], "max_attempts": 3},
    }
)
app = App([THROTTLED, DEBOUNCED])


@app.handler(THROTTLED.lane)
async def handle(event: bytes, ctx: Context) -> None:
    """A fifth of the messages fail once: their keys park, their copies run from the tier."""
    if json.loads(event)["n"] % 5 == 0 and ctx.attempt == 1:
        raise Retry("once, to park the key and retry it")


@app.handler(DEBOUNCED.lane)
async def turn(events: list[bytes], ctx: Context) -> None:
    """Nothing: the turn is the point."""
