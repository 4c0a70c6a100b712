"""Read-only views of what a test run left on the in-memory broker: messages and dead letters."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline import headers as h
from pipeline.envelope import Message
from pipeline.testing.memory.broker import MemoryBroker


def messages_on(broker: MemoryBroker, *topics: str) -> list[Message]:
    """Every message stored on ``topics``, in the order they were produced (across them all)."""
    stored = [
        (e.seq, Message(topic, p, offset, e.key, e.value, dict(e.headers), e.timestamp_ms))
        for topic in topics
        for p, log in enumerate(broker.topic(topic).partitions)
        for offset, e in enumerate(log)
    ]
    return [message for _, message in sorted(stored, key=lambda pair: pair[0])]


def _text(message: Message, name: str) -> str | None:
    raw = message.headers.get(name)
    return raw.decode(errors="replace") if raw is not None else None


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """A message on a dead-letter topic, with the headers the retry router gave it.

    Attributes:
        message: the dead-letter message itself (value and key as produced originally).
        reason: ``fatal``, ``exhausted``, ``expired``, ``poison``, ...
        error_class: the dotted class name of the last error, if there was one.
        error_message: its text (cut to 500 characters).
        attempts: the attempt that failed last (1 for the first delivery).
        origin_topic: the topic the message was first delivered from.
        tenant: its tenant header.
    """

    message: Message
    reason: str | None
    error_class: str | None
    error_message: str | None
    attempts: int
    origin_topic: str | None
    tenant: str | None

    @classmethod
    def of(cls, message: Message) -> DeadLettered:
        """Read the router's headers of ``message``."""
        return cls(
            message,
            _text(message, h.DEAD_REASON),
            _text(message, h.ERROR_CLASS),
            _text(message, h.ERROR_MESSAGE),
            h.int_header(message.headers, h.ATTEMPT, 1),
            _text(message, h.ORIGIN_TOPIC),
            _text(message, h.TENANT),
        )
