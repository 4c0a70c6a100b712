"""An app whose handler kills its own process on the message ``poison`` (for the poison test).

The lane comes from ``POISON_TOPIC``; handled values are added to the Redis set ``POISON_DONE``.
"""

from __future__ import annotations

import os

from redis.asyncio import Redis

from pipeline.runtime import App, Context
from pipeline.topics.spec import TopicSpec

spec = TopicSpec.model_validate(
    {"name": os.environ["POISON_TOPIC"], "partitions": 1, "retry": {"tiers": ["200ms"]}}
)
app = App([spec])
_redis = Redis.from_url(os.environ.get("PIPELINE_REDIS__URL", "redis://127.0.0.1:6379/0"))


@app.handler(spec.lane)
async def handle(event: bytes, ctx: Context) -> None:
    """Record the value, or die on ``poison`` the way a segfault or OOM kill would."""
    if event == b"poison":
        os._exit(17)
    await _redis.sadd(os.environ["POISON_DONE"], event)
