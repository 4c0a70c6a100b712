"""What a handler knows about the message it is handling."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline import headers as h
from pipeline.envelope import Message


@dataclass(frozen=True, slots=True)
class Context:
    """The second argument of every handler.

    Attributes:
        message: the raw message (topic, partition, offset, key, value, headers).
        lane: the lane the handler serves.
        attempt: 1 for the first processing attempt, 2 for the first retry, and so on.
    """

    message: Message
    lane: str
    attempt: int

    @property
    def key(self) -> str | None:
        """The message key as text (the conversation, document or other ordering key)."""
        return self.message.key.decode(errors="replace") if self.message.key else None

    @property
    def tenant(self) -> str | None:
        """The tenant header, if the producer set one."""
        raw = self.message.headers.get(h.TENANT)
        return raw.decode(errors="replace") if raw else None

    @property
    def event_id(self) -> str | None:
        """The provider's event id header, if the producer set one."""
        raw = self.message.headers.get(h.EVENT_ID)
        return raw.decode(errors="replace") if raw else None
