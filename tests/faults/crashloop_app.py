"""The consumer app of the crash-loop scenario (``pipeline consume faults.crashloop_app:app``).

Environment as for :mod:`faults.app` (``PIPELINE_TOPICS_DIR``, ``FAULTS_LANE``, ``FAULTS_PREFIX``,
``PIPELINE_REDIS__URL``), plus ``FAULTS_WORK_MS``, the time the handler's downstream call takes.

The event body is JSON ``{"id", "tenant", "key", "seq", "mode"}``. Each run of the handler is
recorded in Redis (``spans.lua``): its entry, with a token unique to the run that starts with the
member's process id, and its exit. An event of mode ``"flaky"`` fails (``Retry``) the first time
it runs, whichever copy and attempt that is (``<prefix>:failed`` records it). The side effect is
``apply.lua``, keyed by the event id at the receiving end: ``<prefix>:applied`` marks it applied,
``<prefix>:order:<key>`` lists the first successes in order, ``<prefix>:runs`` counts every run
that reached it, and ``<prefix>:reached:<key>`` the event of every run that reached it, repeats
included, in order.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import secrets
from pathlib import Path

from redis.asyncio import Redis

from pipeline import headers as h
from pipeline.errors import Retry
from pipeline.runtime import App, Context

LANE = os.environ["FAULTS_LANE"]
PREFIX = os.environ["FAULTS_PREFIX"]
WORK_S = float(os.environ.get("FAULTS_WORK_MS", "5")) / 1000
HERE = Path(__file__).parent
# pid first (the runner records kills by pid); the nonce keeps tokens apart if a pid is reused.
RUN = f"{os.getpid()}.{secrets.token_hex(4)}"

# Every decision of the run guard, one line each: a run that fails shows them per key.
logging.getLogger("pipeline.guard.decisions").setLevel(logging.DEBUG)

app = App(os.environ["PIPELINE_TOPICS_DIR"])
_redis = Redis.from_url(os.environ["PIPELINE_REDIS__URL"])
_apply = _redis.register_script((HERE / "apply.lua").read_text(encoding="utf-8"))
_span = _redis.register_script((HERE / "spans.lua").read_text(encoding="utf-8"))
_SPAN_KEYS = [f"{PREFIX}:clock", f"{PREFIX}:spans", f"{PREFIX}:left"]
_runs = itertools.count()


@app.handler(LANE)
async def handle(event: bytes, ctx: Context) -> None:
    """Record the run, fail a flaky event's first run, else apply the side effect once."""
    body = json.loads(event)
    message = ctx.message
    headers = message.headers
    partition = headers.get(h.ORIGIN_PARTITION, str(message.partition).encode()).decode()
    offset = headers.get(h.ORIGIN_OFFSET, str(message.offset).encode()).decode()
    token = f"{RUN}.{next(_runs)}"
    where = f"{message.topic}:{message.partition}:{message.offset}"
    entry = f"{body['key']} {body['id']} {ctx.attempt} {where}"
    await _span(keys=_SPAN_KEYS, args=["enter", token, entry])
    try:
        await asyncio.sleep(WORK_S)  # the workload: a downstream call
        if body["mode"] == "flaky" and await _redis.hsetnx(f"{PREFIX}:failed", body["id"], 1):
            raise Retry("injected: the first run of a flaky event fails")
        keys = [
            f"{PREFIX}:applied",
            f"{PREFIX}:order:{body['key']}",
            f"{PREFIX}:runs",
            f"{PREFIX}:reached:{body['key']}",
        ]
        await _apply(keys=keys, args=[body["id"], f"{body['seq']}:{partition}:{offset}"])
    finally:
        # Shielded: a cancelled run still records its exit, or it would look like running on.
        await asyncio.shield(_span(keys=_SPAN_KEYS, args=["leave", token, ""]))
