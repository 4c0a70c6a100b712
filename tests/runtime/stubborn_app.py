"""An app whose handler swallows its cancellation (for the shutdown tests of `pipeline consume`).

The lane comes from ``STUBBORN_TOPIC``; each handler start pushes the value onto the Redis list
``STUBBORN_STARTED``.
"""

from __future__ import annotations

import asyncio
import os

from redis.asyncio import Redis

from pipeline.runtime import App, Context
from pipeline.topics.spec import TopicSpec

spec = TopicSpec.model_validate({"name": os.environ["STUBBORN_TOPIC"], "partitions": 1})
app = App([spec])
_redis = Redis.from_url(os.environ.get("PIPELINE_REDIS__URL", "redis://127.0.0.1:6379/0"))


@app.handler(spec.lane)
async def handle(event: bytes, ctx: Context) -> None:
    """Record the start, then wait for ever, taking no notice of cancellation."""
    await _redis.rpush(os.environ["STUBBORN_STARTED"], event)
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue
