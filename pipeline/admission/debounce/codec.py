"""The buffered form of a message: a compact length-prefixed binary record.

A debounced message waits in Redis until its turn, so it is stored whole (payload, key,
headers, where it came from). The layout is a fixed header followed by the variable parts, all
integers big-endian::

    version u8 | partition u32 | offset i64 | timestamp_ms i64 | topic_len u16
    | key_len i32 (-1: no key) | value_len u32 | header_count u16
    | topic | key | value | (name_len u16 | value_len u32 | name | value) * header_count

On a typical chat message it is 30 % smaller than JSON with base64 (200 against 285 bytes) and
about twice as fast to write and read back (``bench/debounce.py --codec`` measures both).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

from pipeline.envelope import Message
from pipeline.headers import EVENT_ID

VERSION = 1
_HEAD = struct.Struct(">BIqqHiIH")
_HEADER = struct.Struct(">HI")


class CodecError(ValueError):
    """A buffered record is truncated or of an unknown version."""


@dataclass(frozen=True, slots=True)
class BufferedMessage:
    """A consumed message as a turn hands it to the handler (see :class:`Message`).

    Attributes:
        topic: topic name.
        partition: partition number.
        offset: position in the partition.
        key: the partitioning key, or None.
        value: the payload bytes.
        headers: header name to raw bytes.
        timestamp_ms: broker or producer timestamp in milliseconds since the epoch.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes] = field(default_factory=dict)
    timestamp_ms: int = 0

    @classmethod
    def of(cls, message: Message) -> BufferedMessage:
        """The buffered form of a consumed ``message`` (its delivery count is not kept)."""
        return cls(
            message.topic,
            message.partition,
            message.offset,
            message.key,
            message.value,
            dict(message.headers),
            message.timestamp_ms,
        )

    @property
    def message_id(self) -> str:
        """``topic:partition:offset``, the id stamped into the conversation's marker."""
        return f"{self.topic}:{self.partition}:{self.offset}"

    @property
    def event_digest(self) -> str:
        """A digest of the ``pl-event-id`` header (16 hex digits), or "" when it has none.

        Copies of one event (a replay of the ingress's sweeper) share it at different offsets.
        """
        event_id = self.headers.get(EVENT_ID)
        return event_digest(event_id) if event_id else ""


def event_digest(event_id: bytes) -> str:
    """The digest of an event id (16 hex digits) the debouncer keeps and is asked about."""
    return hashlib.blake2b(event_id, digest_size=8).hexdigest()


def encode(message: BufferedMessage) -> bytes:
    """Serialise ``message`` into the layout in the module docstring."""
    topic = message.topic.encode()
    key = message.key
    parts = [
        _HEAD.pack(
            VERSION,
            message.partition,
            message.offset,
            message.timestamp_ms,
            len(topic),
            -1 if key is None else len(key),
            len(message.value),
            len(message.headers),
        ),
        topic,
        key or b"",
        message.value,
    ]
    for name, value in message.headers.items():
        encoded = name.encode()
        parts += (_HEADER.pack(len(encoded), len(value)), encoded, value)
    return b"".join(parts)


def decode(data: bytes) -> BufferedMessage:
    """Read a record written by :func:`encode`.

    Raises:
        CodecError: the record is truncated or has another version.
    """
    view = memoryview(data)
    try:
        version, partition, offset, timestamp_ms, topic_len, key_len, value_len, count = (
            _HEAD.unpack_from(view)
        )
        if version != VERSION:
            raise CodecError(f"unknown buffered message version {version}")
        at = _HEAD.size
        topic = bytes(view[at : at + topic_len]).decode()
        at += topic_len
        key = None if key_len < 0 else bytes(view[at : at + key_len])
        at += max(key_len, 0)
        value = bytes(view[at : at + value_len])
        at += value_len
        headers: dict[str, bytes] = {}
        for _ in range(count):
            name_len, header_len = _HEADER.unpack_from(view, at)
            at += _HEADER.size
            name = bytes(view[at : at + name_len]).decode()
            at += name_len
            headers[name] = bytes(view[at : at + header_len])
            at += header_len
    except (struct.error, UnicodeDecodeError) as exc:
        raise CodecError(f"truncated buffered message: {exc}") from exc
    if at != len(data):
        raise CodecError(f"buffered message of {len(data)} bytes does not match its lengths ({at})")
    return BufferedMessage(topic, partition, offset, key, value, headers, timestamp_ms)
