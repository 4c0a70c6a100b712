"""Writing a payload to its lane's store and producing its reference instead.

:class:`Offloader` is used by the ingress (before the row is inserted, so the object is durable
before the 2xx) and by :class:`OffloadingProducer` (before the message is produced). Keys are
content-addressed: a retry or a duplicate finds the object and writes nothing new (a look the
store refuses, as AWS refuses a key without ``s3:ListBucket`` any object not yet written, is a
write: its answer says whether the key works). An object older than ``refresh_after_s`` is
written again instead of reused, so the purge (:mod:`pipeline.offload.purge`), which goes by
the last write time, never deletes an object a new message still points to.

A reference produced again without its body (a retry tier, a dead letter, a redrive, a replay,
a swept log row) gets the same guarantee from :meth:`Offloader.keep`: an object last written
over ``refresh_after_s`` ago is read back (digest checked) and written again before the
reference goes out. So every copy of a reference anywhere was produced less than
``refresh_after_s`` after its object's last write, and the purge can go by the age of the
oldest copy still held.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.envelope import Delivered, Record
from pipeline.offload import reference as ref
from pipeline.offload.errors import (
    OffloadError,
    PayloadCorrupt,
    PayloadMissing,
    ReferenceRefused,
)
from pipeline.offload.lazy import LazyPayload
from pipeline.offload.objects import denied, refused
from pipeline.offload.observer import OffloadObserver
from pipeline.offload.policy import OffloadPolicy
from pipeline.offload.store import PayloadStore, StoredObject, check_stores, open_store
from pipeline.transport.protocol import Producer

log = logging.getLogger(__name__)

REFRESH_AFTER_S = 86_400.0
"""An existing object older than this is written again rather than reused (see the purge)."""
PURGEABLE_AFTER_S = 15 * 86_400.0
"""The youngest age the purge deletes at (unless forced): the dead-letter topic's 14 days plus
:data:`REFRESH_AFTER_S` (:func:`pipeline.offload.purge.floor_ms`)."""
RECHECK_AFTER_S = 2.0
"""A writer that rewrote an object at least :data:`PURGEABLE_AFTER_S` old looks at it again this
long after, and writes it once more if a purge deleted it meanwhile: the purge sends its delete
within :data:`~pipeline.offload.objects.CHECK_TO_DELETE_S` of its look, or not at all. The look
runs beside the caller (the webhook is answered, the message produced, without waiting for it);
:meth:`Offloader.settle` waits for the looks still to come."""
KNOWN_FRESH_KEYS = 10_000
"""Objects an :class:`Offloader` remembers as young enough, so producing their references again
costs no HEAD (the memory is cleared when it grows past this)."""
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
    refreshed: int = 0
    """Objects written again, from their own bytes, so a reference produced again stays safe."""


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
    purgeable_after_s: float = PURGEABLE_AFTER_S
    pause: Callable[[float], Awaitable[None]] = asyncio.sleep
    """How the writer waits :data:`RECHECK_AFTER_S` before it looks again (tests replace it)."""
    _stores: dict[str, PayloadStore] = field(default_factory=dict)
    _fresh_until: dict[str, float] = field(default_factory=dict)
    _written_s: dict[str, float] = field(default_factory=dict)
    _rechecks: set[asyncio.Task[None]] = field(default_factory=set)

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
        existing = await _looked_at(store, reference.key)
        fresh = existing is not None and (
            time.time() - existing.last_modified.timestamp() < self.refresh_after_s
        )
        if fresh and existing is not None and existing.size == reference.size:
            self.counters.reused += 1
            if self.observer is not None:
                self.observer.reused(store.url)
            # This process's own write, when it made it: a duplicate gets the same reference.
            written_s = self._written_s.get(_memo(reference), existing.last_modified.timestamp())
            self._remember(reference, existing.last_modified.timestamp(), written_s)
        else:
            written_s = time.time()  # before the write: never later than the store's own time
            await self._write(store, reference, body, existing, written_s)
        return dataclasses.replace(reference, written_ms=int(written_s * 1000)).encode()

    async def keep(self, topic: str, value: bytes, headers: Mapping[str, bytes]) -> None:
        """Before a reference to ``topic`` is produced again: make its object young enough.

        An object last written ``refresh_after_s`` ago or more is read back whole (size and
        digest checked) and written again, so the purge, which goes by the oldest copy still
        held (:func:`pipeline.offload.purge.measured_floor_ms`), cannot delete it while this copy
        lives.
        An object known young from an earlier call costs nothing. Nothing is done for a topic
        without a policy, a reference to another store than the topic's, or one this version
        cannot read (the member refuses those), nor for an object already gone or no longer
        matching its reference (the member dead-letters those as ``payload_missing`` or
        ``payload_corrupt``; a warning says so here). When the store fails, a reference whose
        ``written_ms`` is less than ``refresh_after_s`` ago goes out without the look (a
        warning says so): the copy is then as safe from the purge as the message it copies, and
        a member whose store is down still sends its failed message to a retry tier instead of
        leaving it undelivered until it restarts.

        Raises:
            OffloadError: the store failed and the reference does not say its object was
                written less than ``refresh_after_s`` ago (it must not be produced then).
        """
        reference = self._own_reference(topic, value, headers)
        now = time.time()
        if reference is None or self._fresh_until.get(_memo(reference), 0.0) > now:
            return
        store = self.store(reference.store)
        try:
            existing = await store.head(reference.key)
        except OffloadError as exc:
            if self._written_lately(reference, now):
                # Written less than a day ago by the reference's own word: the copy is as safe
                # from the purge as its writer's message was, so a store outage does not hold
                # it back.
                log.warning(
                    "%s; the reference produced to %s goes out unchecked: its object was"
                    " written less than %g s ago",
                    exc,
                    topic,
                    self.refresh_after_s,
                )
                return
            if not refused(exc):
                raise
            existing = None  # a HEAD's 403 says nothing: the read's answer names why
        if existing is not None and now - existing.last_modified.timestamp() < self.refresh_after_s:
            self._remember(reference, existing.last_modified.timestamp())
            return
        try:  # gone (None), old, or refused the look: read back whole, then written again
            body = await LazyPayload(reference, store).read()
        except (PayloadMissing, PayloadCorrupt) as exc:
            log.warning("%s; the reference produced to %s will be a dead letter", exc, topic)
            return
        except OffloadError as exc:
            if not denied(exc):
                raise
            # A key without s3:ListBucket: the object is gone, or this key may not read it.
            # Either way nothing here can keep it, and holding the message back would retry its
            # route for ever: it goes on, to fail at its member like any unreadable payload.
            log.warning(
                "%s; the reference produced to %s goes out unchecked: to a key without"
                " s3:ListBucket a missing object is AccessDenied too, so it may be gone",
                exc,
                topic,
            )
            return
        await self._write(store, reference, body, existing)
        self.counters.refreshed += 1

    def _written_lately(self, reference: ref.Reference, now_s: float) -> bool:
        """Whether ``reference`` says its object was written less than ``refresh_after_s`` ago."""
        if reference.written_ms is None:
            return False
        return 0.0 <= now_s - reference.written_ms / 1000 < self.refresh_after_s

    def _own_reference(
        self, topic: str, value: bytes, headers: Mapping[str, bytes]
    ) -> ref.Reference | None:
        """The reference in a message to ``topic`` when it points into the topic's own store."""
        policy = self.policies.get(topic)
        if policy is None:
            return None
        try:
            reference = ref.decode(value, headers)
        except ReferenceRefused:
            return None
        return reference if reference.store == policy.store else None

    async def _write(
        self,
        store: PayloadStore,
        reference: ref.Reference,
        body: bytes,
        found: StoredObject | None,
        began_s: float | None = None,
    ) -> None:
        """Write ``body``; over an object ``found`` old enough to be purged, make sure it stays.

        A purge that looked at that object just before this write deletes it just after (an S3
        delete cannot be made conditional): so look again once its delete must have gone out,
        and write it once more if it is gone.
        """
        await store.put(reference.key, body)
        self.counters.written += 1
        self.counters.bytes_written += len(body)
        if self.observer is not None:
            self.observer.written(store.url, len(body))
        self._remember(reference, time.time(), began_s)
        if found is not None and time.time() - found.last_modified.timestamp() >= (
            self.purgeable_after_s
        ):
            task = asyncio.create_task(self._recheck(store, reference, body))
            self._rechecks.add(task)
            task.add_done_callback(self._rechecks.discard)

    async def _recheck(self, store: PayloadStore, reference: ref.Reference, body: bytes) -> None:
        """Once a purge's delete must have gone out, write a rewritten old object again if gone."""
        try:
            await self.pause(RECHECK_AFTER_S)
            if await _looked_at(store, reference.key) is None:
                log.warning(
                    "offloaded payload %s/%s was purged as it was written again (or the store"
                    " refused the look); written once more",
                    store.url,
                    reference.key,
                )
                await store.put(reference.key, body)
        except OffloadError as exc:
            log.warning(
                "offloaded payload %s/%s: could not look at it again after its rewrite: %s",
                store.url,
                reference.key,
                exc,
            )

    async def settle(self) -> None:
        """Wait for the looks after rewrites still to come (:data:`RECHECK_AFTER_S` at most)."""
        while self._rechecks:
            await asyncio.gather(*self._rechecks, return_exceptions=True)

    def _remember(
        self, reference: ref.Reference, written_s: float, began_s: float | None = None
    ) -> None:
        """Remember the object as last written at ``written_s``.

        ``began_s``: when this process began writing it (its references' ``written_ms``).
        """
        if len(self._fresh_until) >= KNOWN_FRESH_KEYS:
            self._fresh_until.clear()
            self._written_s.clear()
        self._fresh_until[_memo(reference)] = written_s + self.refresh_after_s
        if began_s is not None:
            self._written_s[_memo(reference)] = began_s


async def _looked_at(store: PayloadStore, key: str) -> StoredObject | None:
    """Before a write of ``key``: its object, or None when there is none or the look was refused.

    AWS answers a key without ``s3:ListBucket`` 403, not 404, for an object that does not exist,
    so with such a key (a least-privilege policy) the look at every new payload is refused. The
    write goes ahead: content-addressed, it changes nothing if the object was there, and its own
    answer tells a key that works from one refused whatever it asks (a wrong secret, an unknown
    key id), whose write fails as before.

    Raises:
        OffloadError: the store failed otherwise.
    """
    try:
        return await store.head(key)
    except OffloadError as exc:
        if not refused(exc):
            raise
        return None


def _memo(reference: ref.Reference) -> str:
    return f"{reference.store}|{reference.key}"


def topic_policies(specs: Sequence[object]) -> dict[str, OffloadPolicy]:
    """The offload policy of every topic a declaration owns (main, retry tiers, dead letter)."""
    out: dict[str, OffloadPolicy] = {}
    for spec in specs:
        policy = getattr(spec, "offload", None)
        if isinstance(policy, OffloadPolicy):
            out.update(dict.fromkeys(spec.topic_names(), policy))  # type: ignore[attr-defined]
    return out


async def check_lane_stores(specs: Sequence[object]) -> None:
    """At a process's start: the stores the lanes of ``specs`` offload to, each looked at once.

    Raises:
        ConfigError: no credentials for one (see :func:`~pipeline.offload.store.check_stores`).
    """
    await check_stores(policy.store for policy in topic_policies(specs).values())


class OffloadingProducer:
    """A :class:`~pipeline.transport.protocol.Producer` that offloads large payloads first.

    Wraps another producer: a value above its topic's threshold is written to the store and
    the reference is produced in its place (with the ``pl-offload*`` headers added); a value
    that is already a reference is produced as it is, once :meth:`Offloader.keep` has made its
    object young enough for the purge.
    """

    def __init__(self, inner: Producer, offloader: Offloader) -> None:
        """Produce through ``inner``, offloading with ``offloader``."""
        self._inner = inner
        self._offloader = offloader

    async def _record(self, topic: str, record: Record) -> Record:
        headers = record.headers or {}
        if ref.is_reference(headers):  # produced again (a retry, a redrive): kept young enough
            await self._offloader.keep(topic, record.value, headers)
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
        if self._offloader.policy(topic) is None:
            return await self._inner.send(
                topic, value, key=key, headers=headers, partition=partition
            )
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
        """Wait for the offloader's looks after rewrites, then close the inner producer."""
        await self._offloader.settle()
        await self._inner.close()


def with_offload(
    producer: Producer, topics_dir: Path, max_message_bytes: int | None = None
) -> Producer:
    """``producer``, offloading for the lanes of ``topics_dir`` that declare ``offload:``.

    Without a topics directory, or without an offloading lane, ``producer`` itself.
    ``max_message_bytes``: the process's ``PIPELINE_MAX_MESSAGE_BYTES``, against which each
    lane's ``offload.above`` is checked (:func:`~pipeline.topics.spec.load_spec`).
    """
    if not topics_dir.is_dir():
        return producer
    from pipeline.topics.spec import load_specs  # noqa: PLC0415 - the topics layer sits above

    return offloading(producer, load_specs(topics_dir, max_message_bytes))


def offloading(
    producer: Producer, specs: Sequence[object], observer: OffloadObserver | None = None
) -> Producer:
    """``producer``, offloading for those of ``specs`` that declare ``offload:``.

    Without an offloading lane, ``producer`` itself; else an :class:`OffloadingProducer`, which
    also keeps each reference it produces again young enough for the purge. ``observer`` is
    told of the objects it writes.
    """
    policies = topic_policies(specs)
    if not policies:
        return producer
    return OffloadingProducer(producer, Offloader(policies, observer=observer))
