"""Parts of Redis key names that come from a message, bounded in size.

A producer controls a message's key, its headers (``pl-tenant``, ``pl-event-id``) and its JSON
fields, and the runtime names Redis keys after them: throttle keys, debounce conversations,
``ctx.once`` records, parked keys. Unbounded, a 1 MiB ``pl-tenant`` is a 1 MiB key name, stored
in Redis, sent with every call on it and printed by every log line that names it.

:func:`bounded` is the one form such a part takes in a key name: a part of at most
:data:`NAME_PART_MAX_BYTES` bytes (UTF-8) stays exactly as it is, so the keys of existing
deployments do not change; a longer one becomes ``#sha256:`` and the hex SHA-256 of its UTF-8
bytes (:func:`digest`). Equal values give one key name and distinct values distinct ones, on
every member and in every release. The digest form is itself short, so :func:`bounded` of it is
itself: bounding twice is bounding once. (A producer may send ``#sha256:<hex>`` itself; it then
shares the key of a value whose SHA-256 that is, which only someone holding that value could
name, and who could send the value itself.)

A whole key that is read back by its form (a throttle key, found among the active keys by its
template's fixed text ``org:``) takes :func:`headed` instead: over the bound, its first
:data:`HEAD_CHARS` characters stay before the digest of all of it, so ``org:`` and the start of
the tenant still say whose key it is.
"""

from __future__ import annotations

import hashlib

__all__ = ["DIGEST_PREFIX", "HEAD_CHARS", "NAME_PART_MAX_BYTES", "bounded", "digest", "headed"]

NAME_PART_MAX_BYTES = 1024
"""The longest part of a key name (UTF-8 bytes) kept as it is; a longer one is digested.

Far above any tenant, conversation or event id seen in practice, so the keys members of an
earlier release wrote keep their names; a part longer than this was named in full before."""

HEAD_CHARS = 64
"""The characters of a key over the bound that :func:`headed` keeps before its digest (at most
256 bytes: the result, at most 328 bytes, is far under the bound)."""

DIGEST_PREFIX = "#sha256:"
"""How a digested part starts (``#`` and ``:`` never occur in url-safe base64)."""


def digest(raw: bytes) -> str:
    """The digest form of ``raw``: ``#sha256:`` and its SHA-256 in hex (72 characters)."""
    return DIGEST_PREFIX + hashlib.sha256(raw).hexdigest()


def bounded(part: str) -> str:
    """``part`` if its UTF-8 form is at most :data:`NAME_PART_MAX_BYTES` bytes, else its digest.

    A lone surrogate (no UTF-8 form) is digested as its ``surrogatepass`` bytes.
    """
    if len(part) * 4 <= NAME_PART_MAX_BYTES:  # no character takes more than 4 bytes
        return part
    raw = part.encode(errors="surrogatepass")
    return part if len(raw) <= NAME_PART_MAX_BYTES else digest(raw)


def headed(part: str) -> str:
    """``part`` if at most :data:`NAME_PART_MAX_BYTES` bytes, else its head and its digest.

    The head is its first :data:`HEAD_CHARS` characters; the digest (:func:`digest`) is of all
    of ``part``, so distinct values keep distinct names whatever their heads. The result is at
    most 328 bytes: :func:`headed` of it is itself. ``part`` has a UTF-8 form (no lone
    surrogate: :func:`~pipeline.admission.keys.key_text` replaces them first).
    """
    if len(part) * 4 <= NAME_PART_MAX_BYTES:
        return part
    raw = part.encode()
    return part if len(raw) <= NAME_PART_MAX_BYTES else part[:HEAD_CHARS] + digest(raw)
