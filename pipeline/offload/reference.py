"""The reference that travels through the broker in place of an offloaded payload.

A reference is a small JSON body plus headers; the headers say it is one, so a member tells a
reference from a payload without parsing the body::

    pl-offload               1                     the reference format (see below)
    pl-offload-size          20971520              the payload's size in bytes
    pl-offload-sha256        9f86d08...            the payload's SHA-256, hex
    pl-offload-content-type  application/json      the payload's content type ("" if unknown)

    {"offload": 1, "store": "s3://pipeline/payloads", "key": "sha256/9f/9f86d08...",
     "size": 20971520, "sha256": "9f86d08...", "content_type": "application/json",
     "written_ms": 1765000000000}

The key is derived from the digest (content-addressed), so the same payload written twice is
one object. A member reads ``pl-offload``: a format it does not know is refused
(:class:`~pipeline.offload.errors.ReferenceRefused`), never handed to a handler. The whole
reference stays well under 1 KiB.

``written_ms`` (optional: references written before it have none) is when the writer knew the
object last written, in ms since the epoch: no later than the store's own last write time. A
member whose store does not answer can still send a copy of a reference written less than a
day ago to a retry tier or the dead-letter topic without asking the store
(:meth:`~pipeline.offload.writer.Offloader.keep`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.offload.errors import ReferenceRefused

FORMAT = 1
"""The reference format this version writes and reads."""
OFFLOAD = "pl-offload"
SIZE = "pl-offload-size"
SHA256 = "pl-offload-sha256"
CONTENT_TYPE = "pl-offload-content-type"
HEADERS = (OFFLOAD, SIZE, SHA256, CONTENT_TYPE)
_KEY = re.compile(r"sha256/[0-9a-f]{2}/[0-9a-f]{64}")
_MAX_CONTENT_TYPE_CHARS = 200


@dataclass(frozen=True, slots=True)
class Reference:
    """Where an offloaded payload is, and what it must be when read back."""

    store: str
    key: str
    size: int
    sha256: str
    content_type: str = ""
    written_ms: int | None = None
    """When its object was known last written (ms since the epoch, at or before the store's
    own time of that write), or None when not known."""

    def encode(self) -> tuple[bytes, dict[str, bytes]]:
        """The reference's body and headers."""
        doc: dict[str, object] = {
            "offload": FORMAT,
            "store": self.store,
            "key": self.key,
            "size": self.size,
            "sha256": self.sha256,
            "content_type": self.content_type,
        }
        if self.written_ms is not None:
            doc["written_ms"] = self.written_ms
        body = json.dumps(doc, separators=(",", ":")).encode()
        headers = {
            OFFLOAD: str(FORMAT).encode(),
            SIZE: str(self.size).encode(),
            SHA256: self.sha256.encode(),
            CONTENT_TYPE: self.content_type.encode(),
        }
        return body, headers


def key_for(sha256_hex: str) -> str:
    """The object key of a payload with this digest (two hex digits fan the keys out)."""
    return f"sha256/{sha256_hex[:2]}/{sha256_hex}"


def reference_for(
    store: str, body: bytes | memoryview, content_type: str = "", sha256: str | None = None
) -> Reference:
    """The reference of ``body`` in ``store``.

    Hashes it (call off the event loop when large) unless ``sha256``, its SHA-256 (hex) as this
    process computed it from the same bytes, is given.
    """
    digest = sha256 or hashlib.sha256(body).hexdigest()
    kind = content_type[:_MAX_CONTENT_TYPE_CHARS]
    return Reference(store, key_for(digest), len(body), digest, kind)


def is_reference(headers: Mapping[str, bytes]) -> bool:
    """Whether a message carrying ``headers`` is a reference, not a payload."""
    return OFFLOAD in headers


def decode(value: bytes, headers: Mapping[str, bytes]) -> Reference:
    """The reference of a message whose headers say it is one.

    Raises:
        ReferenceRefused: a reference format this version does not know, or a body that is not
            a well-formed reference (the message is refused, never handed to a handler).
    """
    version = headers.get(OFFLOAD, b"")
    if version != str(FORMAT).encode():
        raise ReferenceRefused(
            f"payload reference format {version.decode(errors='replace')!r} is not known to "
            f"this member (it reads format {FORMAT}): upgrade it"
        )
    try:
        doc = json.loads(value)
        ref = Reference(
            store=str(doc["store"]),
            key=str(doc["key"]),
            size=int(doc["size"]),
            sha256=str(doc["sha256"]),
            content_type=str(doc.get("content_type", "")),
            written_ms=_written_ms(doc.get("written_ms")),
        )
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
        # OverflowError: a size Infinity; RecursionError: a body nested too deep for json
        raise ReferenceRefused("a pl-offload message whose body is not a reference") from None
    if not _KEY.fullmatch(ref.key) or ref.key != key_for(ref.sha256):
        raise ReferenceRefused(f"payload reference key {ref.key[:100]!r} is not content-addressed")
    return ref


def _written_ms(value: object) -> int | None:
    """A reference's ``written_ms``: a count of ms since the epoch, else None (not known)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63:
        return value
    return None
