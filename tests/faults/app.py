"""The consumer app of the fault suite (``pipeline consume faults.app:app``).

Environment: ``PIPELINE_TOPICS_DIR`` (the scenario's one lane), ``FAULTS_LANE``, ``FAULTS_PREFIX``
(where the side effects are recorded) and ``PIPELINE_REDIS__URL`` (the scenario's private Redis).

The webhook body is JSON ``{"id", "tenant", "key", "seq", "mode"}``. ``mode`` ``"poison"`` kills
the member's process the way a segfault or an OOM kill would; ``"slow"`` makes the handler wait
``FAULTS_SLOW_S`` seconds first. The side effect runs through the idempotency guard
(``ctx.once``) and, in one script, marks the event in the hash ``<prefix>:applied`` and appends
``seq:partition:origin offset`` to the list ``<prefix>:order:<key>`` (``apply.lua``), so the
suite can check that it ran exactly once and in per-key order. The effect is also keyed by the
event id at the receiving end, as the guard's documentation asks of effects that must never
repeat; ``<prefix>:runs`` counts how often the guard let it run, so a repeat is still seen.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

from redis.asyncio import Redis

from pipeline import headers as h
from pipeline.runtime import App, Context

LANE = os.environ["FAULTS_LANE"]
PREFIX = os.environ["FAULTS_PREFIX"]
SLOW_S = float(os.environ.get("FAULTS_SLOW_S", "1.0"))

# Every decision of the run guard, one line each: a scenario that fails shows them per key.
logging.getLogger("pipeline.guard.decisions").setLevel(logging.DEBUG)

app = App(os.environ["PIPELINE_TOPICS_DIR"])
_redis = Redis.from_url(os.environ["PIPELINE_REDIS__URL"])
_apply = _redis.register_script((Path(__file__).parent / "apply.lua").read_text(encoding="utf-8"))


@app.handler(LANE)
async def handle(event: bytes, ctx: Context) -> None:
    """Apply the event's side effect once, after its fault (if any)."""
    body = json.loads(event)
    if body["mode"] == "poison":
        os._exit(17)
    if body["mode"] == "slow":
        await asyncio.sleep(SLOW_S)  # the workload: a slow downstream call
    headers = ctx.message.headers
    partition = headers.get(h.ORIGIN_PARTITION, str(ctx.message.partition).encode()).decode()
    offset = headers.get(h.ORIGIN_OFFSET, str(ctx.message.offset).encode()).decode()

    async def apply() -> None:
        keys = [f"{PREFIX}:applied", f"{PREFIX}:order:{body['key']}", f"{PREFIX}:runs"]
        await _apply(keys=keys, args=[body["id"], f"{body['seq']}:{partition}:{offset}"])

    await ctx.once("apply", apply)
