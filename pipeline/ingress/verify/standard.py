"""Standard Webhooks (and Svix): ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``.

The signed content is ``"{id}.{timestamp}.{raw body}"``; the signature header lists
space-separated ``v1,<base64 HMAC-SHA256>`` entries (other versions such as the asymmetric
``v1a`` are skipped). Secrets are ``whsec_<base64 key>``; several may be active at once while a
secret rotates, and one match with any of them is enough. The timestamp must be within the
tolerance (300 s by default, as in the reference library) of the receive time, in both
directions. Svix's ``svix-*`` header names are accepted as well.
(https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md)
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping, Sequence

from pipeline.errors import ConfigError
from pipeline.ingress.errors import Rejected
from pipeline.ingress.verify.protocol import unix_seconds

ID, TIMESTAMP, SIGNATURE = "webhook-id", "webhook-timestamp", "webhook-signature"
_SVIX = {ID: "svix-id", TIMESTAMP: "svix-timestamp", SIGNATURE: "svix-signature"}
SECRET_PREFIX = "whsec_"  # noqa: S105 - a format prefix, not a secret


def decode_secret(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret.

    Raises:
        ConfigError: the secret lacks the prefix or is not base64.
    """
    if not secret.startswith(SECRET_PREFIX):
        raise ConfigError(f"a Standard Webhooks secret starts with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except binascii.Error as exc:
        raise ConfigError(f"a Standard Webhooks secret is whsec_ then base64 ({exc})") from None
    if not key:
        raise ConfigError("a Standard Webhooks secret must not be empty")
    return key


class StandardWebhooksVerifier:
    """Verifies Standard Webhooks signatures against any of the active secrets."""

    headers: tuple[str, ...] = (ID, TIMESTAMP, SIGNATURE, *_SVIX.values())
    signed_headers: frozenset[str] = frozenset({ID, TIMESTAMP, _SVIX[ID], _SVIX[TIMESTAMP]})

    def __init__(self, secrets: Sequence[str], tolerance_s: float) -> None:
        """Decode the ``whsec_`` secrets (ConfigError if one is invalid) and keep the tolerance."""
        self._keys = [decode_secret(secret) for secret in secrets]
        self._tolerance_s = tolerance_s

    def verify(self, headers: Mapping[str, str], body: bytes, now_s: float) -> None:
        """Accept a fresh timestamp with one ``v1`` signature matching one secret."""
        msg_id, timestamp, signature = (
            _header(headers, name) for name in (ID, TIMESTAMP, SIGNATURE)
        )
        if msg_id is None or timestamp is None or signature is None:
            raise Rejected("missing signature header")
        if abs(now_s - unix_seconds(timestamp)) > self._tolerance_s:
            raise Rejected("timestamp outside tolerance")
        candidates = []
        for entry in signature.split():
            version, _, encoded = entry.partition(",")
            if version != "v1":
                continue
            try:
                candidates.append(base64.b64decode(encoded, validate=True))
            except ValueError:  # binascii.Error, or a character outside ASCII
                continue
        if not candidates:
            raise Rejected("malformed signature header")
        # Header values arrive decoded as Latin-1, one character per byte: encoding them back
        # so signs the id's bytes as sent (UTF-8 would change any byte above 0x7F).
        try:
            signed = f"{msg_id}.{timestamp}.".encode("latin-1") + body
        except UnicodeEncodeError:  # no header off the wire has such a character
            raise Rejected("malformed signature header") from None
        for key in self._keys:
            expected = hmac.digest(key, signed, "sha256")
            if any(hmac.compare_digest(expected, candidate) for candidate in candidates):
                return
        raise Rejected("signature mismatch")


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    return value if value is not None else headers.get(_SVIX[name])
