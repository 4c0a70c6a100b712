"""The payload a ``bytes`` handler gets for an offloaded message: nothing is read until asked.

::

    @app.handler("uploads")
    async def handle(event: bytes | LazyPayload, ctx: Context) -> None:
        body = await read_body(event)           # bytes either way
        # or, without holding the whole body:
        async for chunk in event.chunks():      # LazyPayload only
            ...

Every read checks the size and SHA-256 against the reference: a mismatch raises
:class:`~pipeline.offload.errors.PayloadCorrupt` (dead letter ``payload_corrupt``), a missing
object :class:`~pipeline.offload.errors.PayloadMissing` (dead letter ``payload_missing``).
Hashing runs in a thread per chunk (hashlib lets go of the GIL), so neither the transfer nor
the check stalls the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator

from pipeline.offload.errors import PayloadCorrupt, PayloadMissing
from pipeline.offload.observer import OffloadObserver
from pipeline.offload.reference import Reference
from pipeline.offload.store import PayloadStore

CHUNK_BYTES = 1024 * 1024
"""Default streaming chunk size."""


class LazyPayload:
    """An offloaded payload, fetched from its store only when read."""

    __slots__ = ("_body", "_gate", "_observer", "_store", "reference")

    def __init__(
        self,
        reference: Reference,
        store: PayloadStore,
        gate: asyncio.Semaphore | None = None,
        observer: OffloadObserver | None = None,
    ) -> None:
        """The payload ``reference`` points to in ``store``.

        ``gate`` bounds how many chunks are fetched and hashed at once across the payloads
        that share it (a member's): the worker threads doing it take the GIL in turns with the
        event loop, and more of them at once lengthen the loop's stalls, not the throughput.
        ``observer`` is told of each whole read (bytes, duration) and of a missing object.
        """
        self.reference = reference
        self._store = store
        self._gate = gate
        self._observer = observer
        self._body: bytes | None = None

    @property
    def size(self) -> int:
        """The payload's size in bytes (known without reading it)."""
        return self.reference.size

    @property
    def content_type(self) -> str:
        """The payload's content type as received ("" if unknown)."""
        return self.reference.content_type

    @property
    def sha256(self) -> str:
        """The payload's SHA-256, hex."""
        return self.reference.sha256

    def __len__(self) -> int:
        """The payload's size in bytes."""
        return self.reference.size

    async def chunks(self, chunk_bytes: int = CHUNK_BYTES) -> AsyncIterator[bytes]:
        """Stream the payload; the digest is checked once the last chunk is in.

        Raises:
            PayloadMissing: the object is gone.
            PayloadCorrupt: its size or digest differs from the reference's (raised after
                the last chunk: a streaming reader must not commit anything before that; an
                object larger than the reference says is refused at the chunk that passes the
                size: no more than ``size`` bytes are yielded, one chunk past them read).
            OffloadError: the store failed (retried like any failure).
        """
        if self._body is not None:
            for start in range(0, len(self._body), chunk_bytes):
                yield self._body[start : start + chunk_bytes]
            return
        digest = hashlib.sha256()
        size = 0
        started = time.perf_counter()
        source = aiter(self._store.chunks(self.reference.key, chunk_bytes))
        while True:
            async with self._gate or contextlib.nullcontext():
                try:
                    chunk = await anext(source, None)
                except PayloadMissing:
                    if self._observer is not None:
                        self._observer.missing(self._store.url)
                    raise
                if chunk is not None:
                    await asyncio.to_thread(digest.update, chunk)
            if chunk is None:
                break
            size += len(chunk)
            if size > self.reference.size:  # never read on past the promised size
                raise PayloadCorrupt(
                    f"offloaded payload {self.reference.store}/{self.reference.key}: the object "
                    f"holds more than the {self.reference.size} bytes its reference says"
                )
            yield chunk
        self._check(size, digest.hexdigest())
        if self._observer is not None:
            self._observer.fetched(self._store.url, size, time.perf_counter() - started)

    async def read(self) -> bytes:
        """The whole payload (read once, then kept), digest checked."""
        if self._body is None:
            parts = [chunk async for chunk in self.chunks()]
            self._body = parts[0] if len(parts) == 1 else b"".join(parts)
        return self._body

    def _check(self, size: int, sha256: str) -> None:
        ref = self.reference
        if size != ref.size or sha256 != ref.sha256:
            raise PayloadCorrupt(
                f"offloaded payload {ref.store}/{ref.key}: read {size} bytes with sha256 "
                f"{sha256[:12]}..., the reference says {ref.size} bytes, {ref.sha256[:12]}..."
            )


async def read_body(payload: bytes | LazyPayload) -> bytes:
    """The bytes of a ``bytes`` handler's event, inline or offloaded."""
    if isinstance(payload, LazyPayload):
        return await payload.read()
    return payload
