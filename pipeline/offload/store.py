"""The :class:`PayloadStore` protocol, and :func:`open_store` choosing one by URL.

A store keeps payloads under content-addressed keys (``sha256/ab/ab12...``), so a write of a
key that exists writes nothing new. Two implementations, both on obstore:
:class:`~pipeline.offload.s3.S3PayloadStore` (``s3://bucket/prefix``, any S3-compatible
service) and :class:`~pipeline.offload.directory.DirectoryPayloadStore` (``file:///dir``, a
volume every member mounts).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from urllib.parse import urlparse

from pipeline.errors import ConfigError
from pipeline.offload.errors import (
    METADATA_HOST,
    NO_SUCH_BUCKET,
    OffloadError,
    PayloadMissing,
    client_error_text,
    refused_credentials,
)

log = logging.getLogger(__name__)

_PROBE_KEY = "sha256/00/start-check"
"""A key no payload has (not 64 hex digits): its HEAD answers 404 from a store that works."""


@dataclass(frozen=True, slots=True)
class StoredObject:
    """An object in a store: its key, size in bytes and last write time."""

    key: str
    size: int
    last_modified: datetime


class PayloadStore(Protocol):
    """Where offloaded payloads live; every method is async and never blocks the event loop."""

    url: str
    """The store's URL, as written in the lane's ``offload.store``."""

    async def head(self, key: str) -> StoredObject | None:
        """The object at ``key``, or None when there is none."""
        ...

    async def put(self, key: str, data: bytes | memoryview) -> None:
        """Write ``data`` at ``key``; durable (acknowledged by the store) when it returns."""
        ...

    def chunks(self, key: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        """The object's bytes in chunks of about ``chunk_bytes``.

        Raises:
            PayloadMissing: there is no object at ``key``.
        """
        ...

    def list(self, prefix: str = "") -> AsyncIterator[StoredObject]:
        """Every object whose key starts with ``prefix``."""
        ...

    async def delete(self, key: str) -> None:
        """Delete the object at ``key`` (nothing if there is none)."""
        ...

    async def delete_unless_written_since(self, key: str, cutoff_s: float) -> bool:
        """Delete the object at ``key`` unless it was last written at or after ``cutoff_s``.

        For the purge. True when it is gone (deleted, or there was none), False when kept.
        """
        ...


def open_store(url: str) -> PayloadStore:
    """The store of ``url`` (``s3://bucket/prefix`` or ``file:///dir``), not yet contacted.

    Raises:
        ConfigError: another scheme, or a bad ``PIPELINE_OFFLOAD_TIMEOUT_S``.
        OffloadError: the store cannot be opened (a file where the directory should be, a
            malformed URL).
    """
    scheme = urlparse(url).scheme
    if scheme not in ("s3", "file"):
        raise ConfigError(f"offload store {url!r}: expected s3://bucket/prefix or file:///dir")
    try:
        if scheme == "s3":
            from pipeline.offload.s3 import S3PayloadStore  # noqa: PLC0415 - one import per kind

            return S3PayloadStore(url)
        from pipeline.offload.directory import DirectoryPayloadStore  # noqa: PLC0415

        return DirectoryPayloadStore(url)
    except ConfigError:
        raise
    except Exception as exc:
        raise OffloadError(
            f"offload store {url}: cannot open it: {client_error_text(exc)}"
        ) from exc


async def check_stores(urls: Iterable[str]) -> None:
    """At start: one HEAD on each store, so a store that cannot work is known before a payload.

    For ``pipeline ingress serve`` and ``pipeline consume`` with offloading lanes. No credentials,
    or a key the store refuses (a wrong secret, an unknown key id), stop the process (they cannot
    change while it runs); a store that fails otherwise (down, refusing, timed out, a bucket that
    does not exist: it may be created) is one warning line and the process goes on: it may come
    back, and each write or read that fails meanwhile is answered as the docs say (a 503, a
    retry). A HEAD's 403 has no body to say
    which; :func:`_key_refused` asks with a GET.

    Raises:
        ConfigError: no credentials for an S3 store, or refused ones: one line saying which
            variables to set or check.
    """
    for url in sorted(set(urls)):
        store = open_store(url)
        try:
            await store.head(_PROBE_KEY)
        except OffloadError as exc:
            if METADATA_HOST in str(exc):  # the client looked for credentials last there
                raise ConfigError(
                    f"offload store {url}: no credentials: set AWS_ACCESS_KEY_ID and"
                    " AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), or run"
                    " where the instance metadata service serves them"
                ) from None
            reason = str(exc).split(f"{_PROBE_KEY}: ", 1)[-1]
            if refused_credentials(reason) and await _key_refused(store):
                raise ConfigError(f"offload store {url}: {reason}") from None  # read at start
            log.warning(
                "offload store %s %s at start (%s); going on: its payloads fail until it does",
                url,
                "cannot be used" if NO_SUCH_BUCKET in reason else "does not answer",
                reason,
            )


_BAD_KEY = ("InvalidAccessKeyId", "SignatureDoesNotMatch")
"""S3 error codes of a key refused whatever it asks: no later try with it can succeed."""


async def _key_refused(store: PayloadStore) -> bool:
    """Whether a store that answered the start HEAD 403 refuses the key itself.

    A GET's answer names the error. ``AccessDenied`` is also what S3 answers for a missing
    object to a key without ``s3:ListBucket`` (a least-privilege policy), which reads and writes
    every payload: that store starts, with the warning.
    """
    try:
        async for _ in store.chunks(_PROBE_KEY, 1):
            break
    except PayloadMissing:
        return False
    except OffloadError as exc:
        return any(code in str(exc) for code in _BAD_KEY)
    return False
