"""The one-method interface every verification scheme implements.

A verifier sees the raw body, byte for byte as received, never re-serialised JSON. Every
signature comparison is constant-time (:func:`hmac.compare_digest`). A scheme that signs a time
checks it against the receive time with a tolerance in both directions, so a stale request and
one from a skewed clock are both refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from pipeline.ingress.errors import Rejected

MAX_SIGNATURE_HEADER_CHARS = 4096
"""Longest value of a header a scheme reads; a longer one is refused (401) before any work."""

_MAX_TIMESTAMP_DIGITS = 12  # Unix seconds until the year 33658


def unix_seconds(text: str) -> int:
    """A signed timestamp as an int; ASCII digits only, at most 12 of them.

    Raises:
        Rejected: anything else (``str.isdigit`` alone accepts ``²`` and 5,000-digit strings).
    """
    if not (0 < len(text) <= _MAX_TIMESTAMP_DIGITS and text.isascii() and text.isdigit()):
        raise Rejected("malformed signature header")
    return int(text)


class Verifier(Protocol):
    """Decides whether a request really comes from the provider."""

    headers: tuple[str, ...]
    """The (lower-case) headers the scheme reads; the log row keeps them for re-verification."""

    signed_headers: frozenset[str]
    """The (lower-case) headers whose values the signature covers (most schemes: none)."""

    def verify(self, headers: Mapping[str, str], body: bytes, now_s: float) -> None:
        """Return if the request is authentic; raise otherwise.

        Args:
            headers: request headers, names lower-case.
            body: the raw request body.
            now_s: the receive time in seconds since the epoch.

        Raises:
            Rejected: the signature is missing, malformed, wrong, or its time is out of
                tolerance; the reason is a short fixed phrase, safe to count.
        """
        ...
