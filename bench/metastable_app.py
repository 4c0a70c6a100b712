"""The saturated lane of ``bench/metastable.py`` (``pipeline consume metastable_app:app``).

Each message costs ``METASTABLE_SERVICE_MS`` of a downstream that the member calls at most
``PIPELINE_RUNTIME__MAX_CONCURRENCY`` at a time, so the lane's capacity is fixed. A finished
message records its completion time (ms since the epoch) in the hash ``METASTABLE_DONE``.
"""

from __future__ import annotations

import asyncio
import os
import time

from redis.asyncio import Redis

from pipeline.runtime import App, Context

SERVICE_S = float(os.environ["METASTABLE_SERVICE_MS"]) / 1000
DONE = os.environ["METASTABLE_DONE"]

app = App(os.environ["PIPELINE_TOPICS_DIR"])
_redis = Redis.from_url(os.environ["PIPELINE_REDIS__URL"])


@app.handler(os.environ["METASTABLE_LANE"])
async def handle(event: bytes, ctx: Context) -> None:  # noqa: ARG001 - the value is not needed
    """Spend the service time, then record the completion."""
    await asyncio.sleep(SERVICE_S)  # the downstream call
    await _redis.hset(DONE, ctx.event_id or "", int(time.time() * 1000))
