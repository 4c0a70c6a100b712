"""Writing a payload to its lane's store and producing its reference instead.

:class:`Offloader` is used by the ingress (before the row is inserted, so the object is durable
before the 2xx) and by :class:`OffloadingProducer` (before the message is produced). Keys are
content-addressed: a retry or a duplicate finds the object and writes nothing new. An object
older than ``refresh_after_s`` is written again instead of reused, so the purge
(:mod:`pipeline.offload.purge`), which goes by the last write time, never deletes an object a
new message still points to.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.envelope import Delivered, Record
from pipeline.offload import reference as ref
from pipeline.offload.observer import OffloadObserver
from pipeline.offload.policy import OffloadPolicy
from pipeline.offload.store import PayloadStore, open_store
from pipeline.transport.protocol import Producer

log = logging.getLogger(__name__)

REFRESH_AFTER_S = 86_400.0
"""An existing object older than this is written again rather than reused (see the purge)."""
HASH_OFF_LOOP_BYTES = 256 * 1024
"""Hash bodies at least this large in a thread (hashlib lets go of the GIL for them)."""


async def sha256_hex(body: bytes) -> str:
    """The SHA-256 of ``body``, hex; in a worker thread when it is large."""
    if len(body) >= HASH_OFF_LOOP_BYTES:
        return await asyncio.to_thread(lambda: hashlib.sha256(body).hexdigest())
    return hashlib.sha256(body).hexdigest()


@dataclass
class OffloadCounters:
    """What an offloader did since start."""

    written: int = 0
    reused: int = 0
    bytes_written: int = 0


@dataclass
class Offloader:
    """Writes large payloads of offloading topics to their stores; one per process.

    Args:
        policies: the offload policy of each topic that has one (main topics and their retry
            and dead-letter topics all map to the lane's policy).
        observer: told of every object written or reused (the process's metrics), or None.
    """

    policies: Mapping[str, OffloadPolicy]
    refresh_after_s: float = REFRESH_AFTER_S
    counters: OffloadCounters = field(default_factory=OffloadCounters)
    observer: OffloadObserver | None = None
    _stores: dict[str, PayloadStore] = field(default_factory=dict)

    def policy(self, topic: str) -> OffloadPolicy | None:
        """The offload policy of ``topic``, or None when its payloads always travel inline."""
        return self.policies.get(topic)

    def wants(self, topic: str, size: int) -> bool:
        """Whether a payload of ``size`` bytes to ``topic`` goes to the store."""
        policy = self.policies.get(topic)
        return policy is not None and size > policy.above_bytes

    def store(self, url: str) -> PayloadStore:
        """The store at ``url`` (opened once, then shared)."""
        store = self._stores.get(url)
        if store is None:
            store = self._stores[url] = open_store(url)
        return store

    async def offload(
        self, topic: str, body: bytes, content_type: str = "", *, sha256: str | None = None
    ) -> tuple[bytes, dict[str, bytes]] | None:
        """Write ``body`` to ``topic``'s store; the reference's body and headers.

        None when ``body`` stays inline (no policy, or not above its threshold). The object is
        acknowledged by the store before this returns. ``sha256``: the body's digest (hex) when
        the caller already computed it from these bytes (the ingress), so it is not hashed twice.

        Raises:
            OffloadError: the store failed (nothing may be produced or acknowledged then).
        """
        policy = self.policies.get(topic)
        if policy is None or len(body) <= policy.above_bytes:
            return None
        store = self.store(policy.store)
        digest = sha256 or await sha256_hex(body)
        reference = ref.reference_for(store.url, body, content_type, digest)
        existing = await store.head(reference.key)
        fresh = existing is not None and (
            time.time() - existing.last_modified.timestamp() < self.refresh_after_s
        )
        if fresh and existing is not None and existing.size == reference.size:
            self.counters.reused += 1
            if self.observer is not None:
                self.observer.reused(store.url)
        else:
            await store.put(reference.key, body)
            self.counters.written += 1
            self.counters.bytes_written += len(body)
            if self.observer is not None:
                self.observer.written(store.url, len(body))
        return reference.encode()


def topic_policies(specs: Sequence[object]) -> dict[str, OffloadPolicy]:
    """The offload policy of every topic a declaration owns (main, retry tiers, dead letter)."""
    out: dict[str, OffloadPolicy] = {}
    for spec in specs:
        policy = getattr(spec, "offload", None)
        if isinstance(policy, OffloadPolicy):
            out.update(dict.fromkeys(spec.topic_names(), policy))  # type: ignore[attr-defined]
    return out


class OffloadingProducer:
    """A :class:`~pipeline.transport.protocol.Producer` that offloads large payloads first.

    Wraps another producer: a value above its topic's threshold is written to the store and
    the reference is produced in its place (with the ``pl-offload*`` headers added).
    """

    def __init__(self, inner: Producer, offloader: Offloader) -> None:
        """Produce through ``inner``, offloading with ``offloader``."""
        self._inner = inner
        self._offloader = offloader

    async def _record(self, topic: str, record: Record) -> Record:
        headers = dict(record.headers or {})
        if ref.is_reference(headers):  # already a reference (a retry, a redrive): keep it
            return record
        content_type = headers.get("content-type", b"").decode(errors="replace")
        out = await self._offloader.offload(topic, record.value, content_type)
        if out is None:
            return record
        value, extra = out
        return Record(value, record.key, {**headers, **extra}, record.partition)

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Delivered:
        """Offload ``value`` if it is large, then produce (see the inner producer)."""
        record = await self._record(topic, Record(value, key, headers, partition))
        return await self._inner.send(
            topic, record.value, key=record.key, headers=record.headers, partition=record.partition
        )

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        """Offload the large values of ``records``, then produce the batch in order."""
        if self._offloader.policy(topic) is not None:
            records = [await self._record(topic, record) for record in records]
        return await self._inner.send_many(topic, records)

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Wait for the inner producer's acknowledgements."""
        await self._inner.flush(timeout_s)

    async def close(self) -> None:
        """Close the inner producer."""
        await self._inner.close()


def with_offload(producer: Producer, topics_dir: Path) -> Producer:
    """``producer``, offloading for the lanes of ``topics_dir`` that declare ``offload:``.

    Without a topics directory, or without an offloading lane, ``producer`` itself.
    """
    if not topics_dir.is_dir():
        return producer
    from pipeline.topics.spec import load_specs  # noqa: PLC0415 - the topics layer sits above

    policies = topic_policies(load_specs(topics_dir))
    return OffloadingProducer(producer, Offloader(policies)) if policies else producer
