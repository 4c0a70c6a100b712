"""Example consumer group for the debounced ``ai_turns`` lane (topics/ai_turns.yaml).

Run one or more members:

    pipeline topics apply
    pipeline consume consumers.ai_turns:app --group ai-turns

A customer rarely says everything in one message: "hi", "I ordered a lamp", "it arrived broken".
The lane declares ``debounce:`` so a burst of messages in one conversation becomes one *turn*:
the handler is called once per turn with every message since the previous turn, in order, and
answers them with one model call instead of three. A 429 from the model provider raises
:class:`~pipeline.errors.Retry` and a model call that does not answer in time raises
``TimeoutError`` (the default retry policy retries both): the turn runs again after a backoff,
with any messages that arrived meanwhile, and is dead-lettered message by message, in order,
after the lane's last attempt.

The model here is simulated: a lognormal latency around 300 ms, an occasional 429 and an
occasional hang, so the demo (``make demo``) shows realistic retries.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random

from pydantic import BaseModel

from pipeline.errors import Retry
from pipeline.runtime import App, Context

log = logging.getLogger(__name__)
app = App()  # the lanes of PIPELINE_TOPICS_DIR (default topics/)

MODEL_TIMEOUT_S = 2.0
"""How long a model call may take before it is abandoned and the turn retried."""
_MEDIAN_LATENCY_S = 0.3
_LATENCY_SIGMA = 0.5
_RATE_LIMITED = 0.02
_HANGS = 0.01


class AiMessage(BaseModel):
    """One customer message of a conversation handled by an AI agent."""

    conversation_id: str
    text: str


class ModelRateLimited(Exception):
    """The model provider answered 429 Too Many Requests."""


async def call_model(prompt: str) -> str:
    """Pretend to call a hosted language model: slow, sometimes limited, sometimes stuck."""
    roll = random.random()
    if roll < _RATE_LIMITED:
        raise ModelRateLimited("429 Too Many Requests")
    latency_s = _MEDIAN_LATENCY_S * math.exp(random.gauss(0.0, _LATENCY_SIGMA))
    if roll < _RATE_LIMITED + _HANGS:
        latency_s = MODEL_TIMEOUT_S * 10  # a stuck connection; the timeout below cuts it
    await asyncio.sleep(latency_s)
    return f"reply to {len(prompt)} characters"


@app.handler("ai_turns")
async def handle(events: list[AiMessage], ctx: Context) -> None:
    """Answer one turn: every message of the burst, in order, in one model call."""
    prompt = "\n".join(event.text for event in events)
    try:
        async with asyncio.timeout(MODEL_TIMEOUT_S):
            reply = await call_model(prompt)
    except ModelRateLimited as exc:
        raise Retry(str(exc)) from exc
    log.info(
        "turn of %d message(s) in %s (tenant %s, attempt %d): %s",
        len(events),
        events[-1].conversation_id,
        ctx.tenant,
        ctx.attempt,
        reply,
    )
