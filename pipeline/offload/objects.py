"""The operations both payload stores share, on an obstore store (S3 or a local directory).

obstore's calls run in its own Rust runtime: awaiting them never blocks the event loop, and
large bodies move without passing through Python objects chunk by chunk more than once.
Client errors are translated here: a missing object is
:class:`~pipeline.offload.errors.PayloadMissing`, any other failure
:class:`~pipeline.offload.errors.OffloadError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import obstore

from pipeline.offload.errors import OffloadError, PayloadMissing
from pipeline.offload.store import StoredObject


def _stored(meta: Any) -> StoredObject:
    return StoredObject(str(meta["path"]), int(meta["size"]), meta["last_modified"])


class ObjectPayloadStore:
    """A :class:`~pipeline.offload.store.PayloadStore` over one obstore store."""

    def __init__(self, url: str, store: Any) -> None:
        """Serve ``store`` (an obstore store) under the name ``url``."""
        self.url = url
        self._store = store

    async def head(self, key: str) -> StoredObject | None:
        """The object at ``key``, or None (HEAD on S3, a stat on a directory)."""
        try:
            return _stored(await obstore.head_async(self._store, key))
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise OffloadError(f"offload store {self.url}: cannot read {key}: {exc}") from exc

    async def put(self, key: str, data: bytes | memoryview) -> None:
        """Write ``data`` at ``key`` (a multipart upload above obstore's chunk size on S3)."""
        try:
            await obstore.put_async(self._store, key, data)
        except Exception as exc:
            raise OffloadError(f"offload store {self.url}: cannot write {key}: {exc}") from exc

    async def chunks(self, key: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        """The object's bytes in chunks of at least ``chunk_bytes`` (the last may be shorter)."""
        try:
            result = await obstore.get_async(self._store, key)
            async for chunk in result.stream(min_chunk_size=chunk_bytes):
                yield bytes(chunk)
        except FileNotFoundError:
            raise PayloadMissing(f"offloaded payload {self.url}/{key} does not exist") from None
        except PayloadMissing:
            raise
        except Exception as exc:
            raise OffloadError(f"offload store {self.url}: cannot read {key}: {exc}") from exc

    async def list(self, prefix: str = "") -> AsyncIterator[StoredObject]:
        """Every object under ``prefix``, page by page.

        Entries without an ETag are left out: a filesystem-backed S3 service (S3Proxy) lists
        its directories as objects without one; every stored payload has one.
        """
        try:
            async for page in obstore.list(self._store, prefix or None):
                for meta in page:
                    if meta.get("e_tag") is not None:
                        yield _stored(meta)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise OffloadError(f"offload store {self.url}: cannot list: {exc}") from exc

    async def delete(self, key: str) -> None:
        """Delete ``key``; a key already gone is not an error."""
        try:
            await obstore.delete_async(self._store, key)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise OffloadError(f"offload store {self.url}: cannot delete {key}: {exc}") from exc
