"""The explicit ``none`` scheme: accepts every request. Never a default, only written out."""

from __future__ import annotations

from collections.abc import Mapping


class UnverifiedVerifier:
    """Accepts everything; for sources behind another authenticating proxy, or for tests."""

    headers: tuple[str, ...] = ()
    signed_headers: frozenset[str] = frozenset()

    def verify(self, headers: Mapping[str, str], body: bytes, now_s: float) -> None:
        """Accept."""
