"""The lane of ``bench/membership.py`` (``pipeline consume membership_app:app``).

Each run appends ``<ms since the epoch>:<partition>:<value>`` to the Redis list
``MEMBERSHIP_RUNS`` (one round trip), so the benchmark sees every handler run, redeliveries
included, even of a member that is killed right after.
"""

from __future__ import annotations

import os
import time

from redis.asyncio import Redis

from pipeline.runtime import App, Context

RUNS = os.environ["MEMBERSHIP_RUNS"]
HANDLE_MS = float(os.environ.get("MEMBERSHIP_HANDLE_MS", "5"))

app = App(os.environ["PIPELINE_TOPICS_DIR"])
_redis = Redis.from_url(os.environ["MEMBERSHIP_REDIS_URL"])


@app.handler(os.environ["MEMBERSHIP_LANE"])
async def handle(event: bytes, ctx: Context) -> None:
    """Record the run (time, partition, the message's sequence number)."""
    now_ms = int(time.time() * 1000)
    await _redis.rpush(RUNS, f"{now_ms}:{ctx.message.partition}:{event.decode()}")
