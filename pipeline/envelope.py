"""The message as every stage sees it, whatever the transport.

A :class:`Message` is what a consumer receives; :class:`Delivered` is the broker's receipt for a
produced message; :class:`TopicPartition` and :class:`Position` address partitions and committed
positions. Offsets are integers on both transports: Kafka's own offsets, and on Redis Streams a
per-partition sequence assigned atomically at produce time, so "commit offset N" means the same
thing everywhere: every message of that partition below N is done.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple


class TopicPartition(NamedTuple):
    """One partition of one topic.

    A named tuple, not a dataclass: it keys the runtime's per-partition tables and is hashed and
    compared several times per message, which a tuple does in C.
    """

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class Position:
    """A committed position: the next offset to consume in a partition.

    Committing ``Position(tp, 42)`` declares every message of ``tp`` with an offset below 42 done.
    ``metadata`` travels with the commit (Kafka commit metadata; stored beside the position on
    Redis) and is where the runtime records completed offsets above the position.
    """

    tp: TopicPartition
    offset: int
    metadata: str = ""


@dataclass(slots=True)
class Record:
    """One message to produce (see :meth:`Producer.send_many`)."""

    value: bytes
    key: bytes | None = None
    headers: Mapping[str, bytes] | None = None
    partition: int | None = None

    @property
    def size(self) -> int:
        """Bytes of value, key and headers together, as compared with max_message_bytes."""
        extra = sum(len(k) + len(v) for k, v in self.headers.items()) if self.headers else 0
        return len(self.value) + (len(self.key) if self.key else 0) + extra


# Delivered and Message are built once per message on the hot path: plain slotted dataclasses
# (no frozen=True, whose __init__ costs a setattr call per field). Treat them as read-only.
@dataclass(slots=True)
class Delivered:
    """The broker's acknowledgement of one produced message."""

    topic: str
    partition: int
    offset: int


@dataclass(slots=True)
class Message:
    """One consumed message.

    Attributes:
        topic: topic name.
        partition: partition number.
        offset: position in the partition (see the module docstring).
        key: the partitioning key, or None.
        value: the payload bytes.
        headers: header name to raw bytes; names are unique (last one wins).
        timestamp_ms: broker or producer timestamp in milliseconds since the epoch.
        delivery_count: how many times this message has been delivered to the group, this
            delivery included (Redis Streams tracks it exactly; Kafka reports 1).
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes] = field(default_factory=dict)
    timestamp_ms: int = 0
    delivery_count: int = 1

    _tp: TopicPartition | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def tp(self) -> TopicPartition:
        """The message's topic-partition (made once: every stage asks for it)."""
        tp = self._tp
        if tp is None:
            tp = self._tp = TopicPartition(self.topic, self.partition)
        return tp


def printable(raw: bytes | None, *, base64_mark: str = "") -> str | None:
    """Bytes of a message (key, value, header) for a log line or a screen.

    Their text when they are UTF-8, else their base64 after ``base64_mark``; None stays None.
    """
    if raw is None:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return base64_mark + base64.b64encode(raw).decode()
