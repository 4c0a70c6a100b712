"""The deterministic fate of a chaos-test message, shared by the test and its member app."""

from __future__ import annotations

import hashlib


def fate(value: bytes) -> int:
    """A stable number in 0..99 per message: below 5 fails once, 99 is fatal."""
    return hashlib.sha256(value).digest()[0] * 100 // 256
