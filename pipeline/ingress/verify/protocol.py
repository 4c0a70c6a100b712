"""The one-method interface every verification scheme implements.

A verifier sees the raw body, byte for byte as received, never re-serialised JSON. Every
signature comparison is constant-time (:func:`hmac.compare_digest`). A scheme that signs a time
checks it against the receive time with a tolerance in both directions, so a stale request and
one from a skewed clock are both refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Verifier(Protocol):
    """Decides whether a request really comes from the provider."""

    headers: tuple[str, ...]
    """The (lower-case) headers the scheme reads; the log row keeps them for re-verification."""

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
