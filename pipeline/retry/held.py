"""How a parked follower is held in Redis: the whole message, encoded once, decoded on release.

The encoding is one JSON line (topic, partition, offset, timestamp, key and headers, bytes in
base64) followed by the raw value, so the value, the bulk of a message, is never re-encoded.
"""

from __future__ import annotations

import base64
import json

from pipeline.envelope import Message


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def encode_held(message: Message) -> bytes:
    """``message`` as stored behind its key's head."""
    head = {
        "t": message.topic,
        "p": message.partition,
        "o": message.offset,
        "ts": message.timestamp_ms,
        "k": None if message.key is None else _b64(message.key),
        "h": {name: _b64(value) for name, value in message.headers.items()},
    }
    return json.dumps(head, separators=(",", ":")).encode() + b"\n" + message.value


def decode_held(raw: bytes) -> Message:
    """The message :func:`encode_held` stored (as first delivered from its topic)."""
    line, _, value = raw.partition(b"\n")
    head = json.loads(line)
    key = head["k"]
    return Message(
        topic=head["t"],
        partition=head["p"],
        offset=head["o"],
        key=None if key is None else base64.b64decode(key),
        value=value,
        headers={name: base64.b64decode(raw_value) for name, raw_value in head["h"].items()},
        timestamp_ms=head["ts"],
    )
