"""A generic HMAC of the raw body in one header, for providers without a preset.

Configurable: the header, the hash (``sha1``, ``sha256``, ``sha512``), the encoding (``hex`` or
``base64``) and a prefix (``sha256=``). Hex comparison is case-insensitive.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Literal

from pipeline.ingress.errors import Rejected

Algorithm = Literal["sha1", "sha256", "sha512"]
Encoding = Literal["hex", "base64"]


class HmacHeaderVerifier:
    """Verifies ``<prefix><encoded HMAC(body)>`` in one header against any active secret."""

    def __init__(
        self,
        secrets: Sequence[str],
        *,
        header: str,
        algorithm: Algorithm = "sha256",
        encoding: Encoding = "hex",
        prefix: str = "",
    ) -> None:
        """Keep the secrets (UTF-8) and the header's form."""
        self._keys = [secret.encode() for secret in secrets]
        self.headers: tuple[str, ...] = (header.lower(),)
        self.signed_headers: frozenset[str] = frozenset()
        self._digest = getattr(hashlib, algorithm)
        self._encoding = encoding
        self._prefix = prefix

    def verify(self, headers: Mapping[str, str], body: bytes, now_s: float) -> None:  # noqa: ARG002
        """Accept when the header carries the HMAC of ``body`` under one of the secrets."""
        value = headers.get(self.headers[0])
        if value is None:
            raise Rejected("missing signature header")
        value = value.strip()
        if not value.startswith(self._prefix) or len(value) == len(self._prefix):
            raise Rejected("malformed signature header")
        given = value[len(self._prefix) :]
        if self._encoding == "hex":
            given = given.lower()
        for key in self._keys:
            mac = hmac.new(key, body, self._digest)
            expected = (
                mac.hexdigest()
                if self._encoding == "hex"
                else base64.b64encode(mac.digest()).decode()
            )
            if hmac.compare_digest(expected.encode(), given.encode("latin-1", "replace")):
                return
        raise Rejected("signature mismatch")
