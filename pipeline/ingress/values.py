r"""Checks on the values a request yields (tenant, key, event id, kept headers) before storing.

A value is stored as text in the log (SQLite ``TEXT``, PostgreSQL ``text``/``jsonb``) and sent
as a Kafka or Redis header, so it must encode as UTF-8 (no lone surrogate such as ``"\\ud800"``
from a JSON escape), must not hold NUL (PostgreSQL refuses it), and is bounded in length. A bad
value is the request's fault: 400, and it never reaches a group commit where it would fail its
neighbours.
"""

from __future__ import annotations

from pipeline.ingress.errors import Malformed

MAX_VALUE_CHARS = 1024
"""Longest tenant, key or event id accepted."""

MAX_KEPT_HEADER_CHARS = 8192
"""Longest value of a header kept in the log row."""


def checked(name: str, value: str, max_chars: int = MAX_VALUE_CHARS) -> str:
    """``value`` if it is storable, else :class:`Malformed` naming ``name``.

    Raises:
        Malformed: the value is too long, holds NUL, or is not encodable as UTF-8.
    """
    if len(value) > max_chars:
        raise Malformed(f"{name} too long")
    if "\x00" in value:
        raise Malformed(f"{name} contains NUL")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Malformed(f"{name} is not valid UTF-8") from None
    return value
