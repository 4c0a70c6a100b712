"""The app of the debounced crash loop (``pipeline consume faults.debounce_crashloop_app:app``).

Environment as for :mod:`faults.crashloop_app` (``PIPELINE_TOPICS_DIR``, ``FAULTS_LANE``,
``FAULTS_PREFIX``, ``PIPELINE_REDIS__URL``, ``FAULTS_WORK_MS``), plus ``FAULTS_FLAKY_PER_MILLE``:
the share of turn contents whose first run fails.

The lane is debounced by the body's ``conv``; a message body is JSON ``{"id", "conv", "n",
"seq"}`` (``n``: its place in its conversation). Each turn is recorded in Redis, which outlives
the members' kills, in the layout of ``spans.lua`` so the crash loop's readers apply: its entry
(``<prefix>:spans``: token, conversation, content digest, attempt, the ``seq`` of its messages
in turn order, and the clock), and its exit (``<prefix>:left``) with its outcome
(``<prefix>:outcome``: ``ok`` or ``fail``); ``<prefix>:tick_ms`` gives each clock value
Redis' time (ms). The turn's effect runs through ``ctx.once``: it
counts the content's runs in ``<prefix>:effects`` and lists each run's token and content in
``<prefix>:effect_runs``. A content chosen by its digest fails (``Retry``) after its effect, the
first time it runs (``<prefix>:failed``), so its retry must skip the effect.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import os
import secrets

from redis.asyncio import Redis

from pipeline.errors import Retry
from pipeline.runtime import App, Context

LANE = os.environ["FAULTS_LANE"]
PREFIX = os.environ["FAULTS_PREFIX"]
WORK_S = float(os.environ.get("FAULTS_WORK_MS", "200")) / 1000
FLAKY_PER_MILLE = int(os.environ.get("FAULTS_FLAKY_PER_MILLE", "20"))
# pid first (the runner records kills by pid); the nonce keeps tokens apart if a pid is reused.
RUN = f"{os.getpid()}.{secrets.token_hex(4)}"
# spans.lua's record, with the run's outcome beside its exit and each clock value's time.
TURN_LUA = """
local now = redis.call('INCR', KEYS[1])
local t = redis.call('TIME')
redis.call('HSET', KEYS[5], now, t[1] * 1000 + math.floor(t[2] / 1000))
if ARGV[1] == 'enter' then
  redis.call('RPUSH', KEYS[2], ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. now)
else
  redis.call('HSET', KEYS[3], ARGV[2], now)
  redis.call('HSET', KEYS[4], ARGV[2], ARGV[3])
end
return now
"""
EFFECT_LUA = """
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('RPUSH', KEYS[2], ARGV[2] .. ' ' .. ARGV[1])
"""

logging.getLogger("pipeline.guard.decisions").setLevel(logging.DEBUG)

app = App(os.environ["PIPELINE_TOPICS_DIR"])
_redis = Redis.from_url(os.environ["PIPELINE_REDIS__URL"])
_turn = _redis.register_script(TURN_LUA)
_effect = _redis.register_script(EFFECT_LUA)
_TURN_KEYS = [
    f"{PREFIX}:clock",
    f"{PREFIX}:spans",
    f"{PREFIX}:left",
    f"{PREFIX}:outcome",
    f"{PREFIX}:tick_ms",
]
_EFFECT_KEYS = [f"{PREFIX}:effects", f"{PREFIX}:effect_runs"]
_runs = itertools.count()


def content_digest(ids: list[str]) -> str:
    """The name of a turn's content: its messages' ids, in turn order."""
    return hashlib.sha256(",".join(ids).encode()).hexdigest()[:16]


def flaky(content: str) -> bool:
    """Whether the first run of this content fails (``FAULTS_FLAKY_PER_MILLE`` of them)."""
    return int(content[:8], 16) % 1000 < FLAKY_PER_MILLE


@app.handler(LANE)
async def turn(events: list[bytes], ctx: Context) -> None:
    """Record the turn, run its effect once (``ctx.once``), fail a flaky content's first run."""
    bodies = [json.loads(event) for event in events]
    content = content_digest([body["id"] for body in bodies])
    seqs = ",".join(str(body["seq"]) for body in bodies)
    token = f"{RUN}.{next(_runs)}"
    entry = f"{bodies[0]['conv']} {content} {ctx.attempt} {seqs}"
    await _turn(keys=_TURN_KEYS, args=["enter", token, entry])
    outcome = "fail"
    try:
        await asyncio.sleep(WORK_S)  # the workload: a model call

        async def effect() -> None:
            await _effect(keys=_EFFECT_KEYS, args=[content, token])

        await ctx.once("effect", effect)
        if flaky(content) and await _redis.hsetnx(f"{PREFIX}:failed", content, 1):
            raise Retry("injected: the first run of a flaky turn fails after its effect")
        outcome = "ok"
    finally:
        # Shielded: a cancelled run still records its exit, or it would look like running on.
        await asyncio.shield(_turn(keys=_TURN_KEYS, args=["leave", token, outcome]))
