"""An app for the chaos test: 5% of messages fail once (retryable), 1% fail fatally.

The lane comes from ``CHAOS_TOPIC``; each success appends the message's sequence number to the
Redis list ``CHAOS_PREFIX:<key>``, so the test can check per-key order.
"""

from __future__ import annotations

import os

from redis.asyncio import Redis
from runtime.chaos_fate import fate

from pipeline.errors import DeadLetter
from pipeline.runtime import App, Context
from pipeline.topics.spec import TopicSpec

spec = TopicSpec.model_validate(
    {
        "name": os.environ["CHAOS_TOPIC"],
        "partitions": 4,
        "retry": {"tiers": ["200ms", "400ms"], "max_attempts": 3},
    }
)
app = App([spec])
_redis = Redis.from_url(os.environ.get("PIPELINE_REDIS__URL", "redis://127.0.0.1:6379/0"))


@app.handler(spec.lane)
async def handle(event: bytes, ctx: Context) -> None:
    """Fail as the message's fate says, else record the success in order."""
    if fate(event) == 99:
        raise DeadLetter("unprocessable")
    if fate(event) < 5 and ctx.attempt == 1:
        raise RuntimeError("transient upstream error")
    key, _, seq = event.decode().partition(":")
    await _redis.rpush(f"{os.environ['CHAOS_PREFIX']}:{key}", seq)
