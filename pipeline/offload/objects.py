"""The operations both payload stores share, on an obstore store (S3 or a local directory).

Every obstore call is its blocking form run in a worker thread (it lets go of the GIL while it
waits), so the event loop never waits on the store. Not obstore's ``*_async`` forms: with
obstore 0.12.1 they can abort the interpreter as it exits (SIGABRT, exit 134), which a member
or a command must never do.
Client errors are translated here: a missing object is
:class:`~pipeline.offload.errors.PayloadMissing`, any other failure
:class:`~pipeline.offload.errors.OffloadError`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import obstore
from obstore.exceptions import PermissionDeniedError

from pipeline.offload.errors import (
    OffloadError,
    PayloadMissing,
    bucket_missing,
    client_error_text,
    no_such_bucket,
)
from pipeline.offload.store import StoredObject

ACCESS_DENIED = "AccessDenied"
"""S3's error code of a request a working key may not make (in a GET's answer)."""
CHECK_TO_DELETE_S = 1.0
"""The purge sends an object's delete within this many seconds of asking for its last write
time, or keeps it for its next run: a writer that rewrote the object meanwhile looks again
later than that (:data:`~pipeline.offload.writer.RECHECK_AFTER_S`) and writes it once more."""


def refused(error: OffloadError) -> bool:
    """Whether the store answered the request that failed with ``error`` 403 (refused it).

    A HEAD's 403 has no body to say why: a key refused whatever it asks (a wrong secret, an
    unknown key id), a key without access to the object, or, on AWS, a key without
    ``s3:ListBucket`` asking for an object that does not exist (a least-privilege policy that
    reads and writes every payload).
    """
    return isinstance(error.__cause__, PermissionDeniedError)


def denied(error: OffloadError) -> bool:
    """Whether a read (a GET, whose 403 names its S3 error code) was answered AccessDenied.

    The key works (a wrong secret or key id has codes of its own), but may not read the object:
    to a key without ``s3:ListBucket`` that is also what AWS answers for an object that does not
    exist, so the two cannot be told apart.
    """
    return refused(error) and f"403 Forbidden {ACCESS_DENIED}" in str(error)


def _stored(meta: Any) -> StoredObject:
    return StoredObject(str(meta["path"]), int(meta["size"]), meta["last_modified"])


def _next_bytes(stream: Iterator[Any]) -> bytes | None:
    """The stream's next chunk as bytes (copied here, in the worker thread), None at its end."""
    chunk = next(stream, None)
    return None if chunk is None else bytes(chunk)


class ObjectPayloadStore:
    """A :class:`~pipeline.offload.store.PayloadStore` over one obstore store."""

    def __init__(self, url: str, store: Any) -> None:
        """Serve ``store`` (an obstore store) under the name ``url``."""
        self.url = url
        self._store = store

    def _error_text(self, exc: BaseException) -> str:
        """The client's error ``exc`` as one line."""
        if no_such_bucket(exc):
            return bucket_missing(self.url)
        return client_error_text(exc)

    async def head(self, key: str) -> StoredObject | None:
        """The object at ``key``, or None (HEAD on S3, a stat on a directory)."""
        try:
            return _stored(await asyncio.to_thread(obstore.head, self._store, key))
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise OffloadError(
                f"offload store {self.url}: cannot read {key}: {self._error_text(exc)}"
            ) from exc

    async def put(self, key: str, data: bytes | memoryview) -> None:
        """Write ``data`` at ``key`` (a multipart upload above obstore's chunk size on S3)."""
        try:
            await asyncio.to_thread(obstore.put, self._store, key, data)
        except Exception as exc:
            raise OffloadError(
                f"offload store {self.url}: cannot write {key}: {self._error_text(exc)}"
            ) from exc

    async def chunks(self, key: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        """The object's bytes in chunks of at least ``chunk_bytes`` (the last may be shorter)."""
        try:
            result = await asyncio.to_thread(obstore.get, self._store, key)
            stream = iter(result.stream(min_chunk_size=chunk_bytes))
            while (chunk := await asyncio.to_thread(_next_bytes, stream)) is not None:
                yield chunk
        except FileNotFoundError as exc:
            if no_such_bucket(exc):  # not the object: the store is misconfigured (a retry)
                raise OffloadError(
                    f"offload store {self.url}: cannot read {key}: {bucket_missing(self.url)}"
                ) from None
            raise PayloadMissing(f"offloaded payload {self.url}/{key} does not exist") from None
        except PayloadMissing:
            raise
        except Exception as exc:
            raise OffloadError(
                f"offload store {self.url}: cannot read {key}: {self._error_text(exc)}"
            ) from exc

    async def list(self, prefix: str = "") -> AsyncIterator[StoredObject]:
        """Every object under ``prefix``, page by page.

        A page is handed out before the next is read, so a listing (a purge's) holds one page,
        however large the store. Entries without an ETag are left out: a filesystem-backed S3
        service (S3Proxy) lists its directories as objects without one; every stored payload
        has one.
        """
        pages: Iterator[Sequence[Any]] | None = None
        while True:
            try:
                if pages is None:
                    pages = await asyncio.to_thread(self._pages, prefix)
                page = await asyncio.to_thread(next, pages, None)
            except FileNotFoundError:
                return
            except Exception as exc:
                raise OffloadError(
                    f"offload store {self.url}: cannot list: {self._error_text(exc)}"
                ) from exc
            if page is None:
                return
            for meta in page:
                if meta.get("e_tag") is not None:
                    yield _stored(meta)

    def _pages(self, prefix: str) -> Iterator[Sequence[Any]]:
        return iter(obstore.list(self._store, prefix or None))

    async def delete(self, key: str) -> None:
        """Delete ``key``; a key already gone is not an error."""
        try:
            await asyncio.to_thread(obstore.delete, self._store, key)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise OffloadError(
                f"offload store {self.url}: cannot delete {key}: {self._error_text(exc)}"
            ) from exc

    async def delete_unless_written_since(self, key: str, cutoff_s: float) -> bool:
        """Delete ``key`` unless last written at or after ``cutoff_s``: a look, then a delete.

        Not atomic: a write between the two is deleted. The delete is sent within
        :data:`CHECK_TO_DELETE_S` of the look or not at all (False, kept), so a writer that
        looks again after :data:`~pipeline.offload.writer.RECHECK_AFTER_S` finds it gone and
        writes it again.
        """
        began = time.monotonic()
        current = await self.head(key)
        if current is None:
            return True
        if current.last_modified.timestamp() >= cutoff_s:
            return False
        if time.monotonic() - began > CHECK_TO_DELETE_S:
            return False
        await self.delete(key)
        return True
