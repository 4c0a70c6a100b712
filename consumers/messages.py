"""Example consumer group for the ``messages`` lane (topics/messages.yaml).

Run one or more members (they share the partitions):

    pipeline topics apply
    pipeline consume consumers.messages:app --group replies

Each handler invocation gets a typed event; messages of one conversation arrive one at a time, in
order, while different conversations run concurrently. A failure goes through the retry tiers
(5s, 1m, 10m) and then to ``messages.dlq``; later messages of the same conversation wait behind it.

The lane carries two shapes, and :class:`MessageReceived` reads both: the flat
``{"conversation_id", "text"}`` of ``pipeline produce`` and the demo, and the WhatsApp Cloud API
webhook that the ``whatsapp`` source of ``deploy/local/sources.example.yaml`` routes here (try it
with ``pipeline send whatsapp --file deploy/local/webhooks/whatsapp-message.json``).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, model_validator

from pipeline.errors import DeadLetter, Retry
from pipeline.runtime import App, Context

log = logging.getLogger(__name__)
app = App()  # the lanes of PIPELINE_TOPICS_DIR (default topics/)


class MessageReceived(BaseModel):
    """An inbound customer message, as the ingress produces it."""

    conversation_id: str
    text: str

    @model_validator(mode="before")
    @classmethod
    def _from_whatsapp(cls, data: Any) -> Any:
        """Read a WhatsApp webhook: the sender's wa_id is the conversation, the text its body."""
        if not isinstance(data, dict) or data.get("object") != "whatsapp_business_account":
            return data
        try:
            value = data["entry"][0]["changes"][0]["value"]
            message = value["messages"][0]
            return {
                "conversation_id": message["from"],
                "text": message.get("text", {}).get("body", ""),
            }
        except (KeyError, IndexError, TypeError, AttributeError):
            return data  # not a message change: validation names the missing fields


@app.handler("messages")
async def handle(event: MessageReceived, ctx: Context) -> None:
    """Acknowledge the message once per event, however often it is delivered."""
    if not event.text.strip():
        raise DeadLetter("empty message")
    if "rate limited" in event.text:
        raise Retry("provider asked us to slow down")

    async def send_ack() -> None:
        log.info(
            "ack %s (tenant %s, attempt %d): %s",
            event.conversation_id,
            ctx.tenant,
            ctx.attempt,
            event.text,
        )

    await ctx.once("ack", send_ack)
