"""Example consumer group for the ``engagement`` lane (topics/engagement.yaml).

Run one or more members:

    pipeline topics apply
    pipeline consume consumers.engagement:app --group engagement

Comments, likes and mentions arrive in storms: one viral post can send thousands in a minute.
Their order does not matter (``ordered: false``), so every event runs concurrently. Each tenant's
share of the lane is bounded by the lane's per-tenant budget (the ``throttle:`` declaration in the
yaml file, applied by the runtime before the handler is called), so one tenant's storm waits in
its own line instead of in front of everyone else's.

The handler classifies the event with a simulated moderation service (about 40 ms).

:class:`EngagementEvent` reads the flat ``{"conversation_id", "kind", "text"}`` of the demo and
the two webhooks the example sources (``deploy/local/sources.example.yaml``) route here: a
Facebook Page feed change (``whatsapp`` source, ``field: feed``; the post is the conversation)
and a GitHub issue or pull-request comment (``github`` source; the repository is). Try them with
``pipeline send whatsapp --file deploy/local/webhooks/whatsapp-comment.json`` or
``pipeline send github --file deploy/local/webhooks/github-issue-comment.json``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from typing import Any

from pydantic import BaseModel, model_validator

from pipeline.errors import DeadLetter
from pipeline.runtime import App, Context

log = logging.getLogger(__name__)
app = App()  # the lanes of PIPELINE_TOPICS_DIR (default topics/)

_MEDIAN_LATENCY_S = 0.04
_LATENCY_SIGMA = 0.4


class EngagementEvent(BaseModel):
    """A comment, like or mention on a tenant's page."""

    conversation_id: str
    kind: str
    text: str = ""

    @model_validator(mode="before")
    @classmethod
    def _from_webhook(cls, data: Any) -> Any:
        """Read a Page feed change or a GitHub comment into the flat form."""
        if not isinstance(data, dict):
            return data
        try:
            if data.get("object") == "page":
                value = data["entry"][0]["changes"][0]["value"]
                return {
                    "conversation_id": value["post_id"],
                    "kind": value.get("item", "feed"),
                    "text": value.get("message", ""),
                }
            if "repository" in data and "conversation_id" not in data:
                return {
                    "conversation_id": data["repository"]["full_name"],
                    "kind": data.get("action", "event"),
                    "text": (data.get("comment") or {}).get("body", ""),
                }
        except (KeyError, IndexError, TypeError, AttributeError):
            return data  # validation names the missing fields
        return data


async def moderate(text: str) -> bool:
    """Pretend to call a moderation service; True when the text may be shown."""
    await asyncio.sleep(_MEDIAN_LATENCY_S * math.exp(random.gauss(0.0, _LATENCY_SIGMA)))
    return "spam" not in text


@app.handler("engagement")
async def handle(event: EngagementEvent, ctx: Context) -> None:
    """Moderate one engagement event; spam is dead-lettered for a person to look at."""
    if not await moderate(event.text):
        raise DeadLetter("flagged as spam")
    log.info("%s on %s (tenant %s) accepted", event.kind, event.conversation_id, ctx.tenant)
