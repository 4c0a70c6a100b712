"""``X-Hub-Signature-256``: Meta (WhatsApp, Messenger, Instagram) and GitHub.

The header is ``sha256=`` then the lower-case hex HMAC-SHA256 of the raw body, keyed with the
app secret (Meta) or the webhook secret (GitHub). Nothing in it is timed, so there is no
tolerance; redeliveries are caught by the event-id dedupe instead.
(https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries,
https://developers.facebook.com/docs/graph-api/webhooks/getting-started)
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence

from pipeline.ingress.errors import Rejected

HEADER = "x-hub-signature-256"
_PREFIX = "sha256="
_HEX_DIGITS = frozenset("0123456789abcdef")
_SHA256_HEX_LENGTH = 64


class HubSignatureVerifier:
    """Verifies ``X-Hub-Signature-256`` against any of the active secrets (rotation)."""

    headers: tuple[str, ...] = (HEADER,)
    signed_headers: frozenset[str] = frozenset()

    def __init__(self, secrets: Sequence[str]) -> None:
        """Keep the secrets as bytes (UTF-8)."""
        self._keys = [secret.encode() for secret in secrets]

    def verify(self, headers: Mapping[str, str], body: bytes, now_s: float) -> None:  # noqa: ARG002
        """Accept when the header is the HMAC-SHA256 of ``body`` under one of the secrets."""
        value = headers.get(HEADER)
        if value is None:
            raise Rejected("missing signature header")
        value = value.strip().lower()
        digest = value.removeprefix(_PREFIX)
        if (
            not value.startswith(_PREFIX)
            or len(digest) != _SHA256_HEX_LENGTH
            or not _HEX_DIGITS.issuperset(digest)
        ):
            raise Rejected("malformed signature header")
        for key in self._keys:
            expected = hmac.digest(key, body, "sha256").hex()  # one-shot, in C
            if hmac.compare_digest(expected, digest):
                return
        raise Rejected("signature mismatch")
