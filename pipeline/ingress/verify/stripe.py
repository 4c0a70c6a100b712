"""``Stripe-Signature``: ``t=<unix seconds>,v1=<hex>[,v1=<hex>...][,v0=...]``.

Each ``v1`` is the hex HMAC-SHA256 of ``"{t}.{raw body}"`` keyed with the endpoint secret
(``whsec_...``, used as is, not decoded). Several ``v1`` appear while Stripe rolls a secret;
one match is enough. ``v0`` (test-mode legacy) is ignored. The timestamp must be within the
tolerance of the receive time, 300 s by default as in Stripe's libraries.
(https://docs.stripe.com/webhooks#verify-manually)
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence

from pipeline.ingress.errors import Rejected
from pipeline.ingress.verify.protocol import unix_seconds

HEADER = "stripe-signature"


class StripeVerifier:
    """Verifies ``Stripe-Signature`` against any of the active endpoint secrets."""

    headers: tuple[str, ...] = (HEADER,)
    signed_headers: frozenset[str] = frozenset()

    def __init__(self, secrets: Sequence[str], tolerance_s: float) -> None:
        """Keep the secrets (UTF-8) and the tolerance in seconds."""
        self._keys = [secret.encode() for secret in secrets]
        self._tolerance_s = tolerance_s

    def verify(self, headers: Mapping[str, str], body: bytes, now_s: float) -> None:
        """Accept a fresh timestamp with one ``v1`` signature matching one secret."""
        value = headers.get(HEADER)
        if value is None:
            raise Rejected("missing signature header")
        timestamp, signatures = _parse(value)
        if abs(now_s - unix_seconds(timestamp)) > self._tolerance_s:
            raise Rejected("timestamp outside tolerance")
        signed = timestamp.encode() + b"." + body
        for key in self._keys:
            expected = hmac.digest(key, signed, "sha256").hex().encode()
            # Compare against every candidate, without an early exit on the first mismatch.
            if any(hmac.compare_digest(expected, candidate) for candidate in signatures):
                return
        raise Rejected("signature mismatch")


def _parse(value: str) -> tuple[str, list[bytes]]:
    timestamp = ""
    signatures = []
    for item in value.split(","):
        name, sep, text = item.strip().partition("=")
        if not sep:
            raise Rejected("malformed signature header")
        if name == "t":
            timestamp = text
        elif name == "v1":
            signatures.append(text.lower().encode("latin-1", "replace"))
    if not signatures:
        raise Rejected("malformed signature header")
    return timestamp, signatures
