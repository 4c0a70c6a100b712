"""A reference produced again keeps its object young enough for the purge (``Offloader.keep``).

The purge deletes objects last written longer ago than the oldest message still held, plus a
day. A retry tier, a dead letter, a redrive, a replay or a swept row produces an old reference
again; without a rewrite of an object a day old or more, the purge could delete it while the new
copy still points to it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pipeline.envelope import Delivered, Message, Record
from pipeline.offload import reference as ref
from pipeline.offload.errors import OffloadError
from pipeline.offload.policy import OffloadPolicy
from pipeline.offload.store import PayloadStore, StoredObject, open_store
from pipeline.offload.writer import Offloader, OffloadingProducer, offloading
from pipeline.retry.policy import default_retryable
from pipeline.retry.router import RetryRouter
from pipeline.runtime import App, Context
from pipeline.runtime.redirect import Redirector
from pipeline.runtime.stats import Stats
from pipeline.topics.spec import TopicSpec

DAY_S = 86_400
BODY = b"p" * 300_000


def offloader(store_url: str, *, refresh_after_s: float = DAY_S) -> Offloader:
    """An offloader for the topics ``up`` (and its dead letter) writing to ``store_url``."""
    policy = OffloadPolicy.model_validate({"above": "256KiB", "store": store_url})
    return Offloader({"up": policy, "up.dlq": policy}, refresh_after_s=refresh_after_s)


async def written(writer: Offloader) -> tuple[bytes, dict[str, bytes]]:
    """Offload ``BODY`` to ``up``; the reference's body and headers."""
    out = await writer.offload("up", BODY)
    assert out is not None
    return out


class CountingStore:
    """A real store whose HEADs and writes are counted."""

    def __init__(self, inner: PayloadStore) -> None:
        """Count the calls made to ``inner``."""
        self._inner = inner
        self.url = inner.url
        self.heads = 0
        self.puts = 0

    async def head(self, key: str) -> StoredObject | None:
        """Count, then ask the store."""
        self.heads += 1
        return await self._inner.head(key)

    async def put(self, key: str, data: bytes | memoryview) -> None:
        """Count, then write."""
        self.puts += 1
        await self._inner.put(key, data)

    def chunks(self, key: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        """The store's chunks."""
        return self._inner.chunks(key, chunk_bytes)

    def list(self, prefix: str = "") -> AsyncIterator[StoredObject]:
        """The store's listing."""
        return self._inner.list(prefix)

    async def delete(self, key: str) -> None:
        """Delete."""
        await self._inner.delete(key)


def age(path: Path, days: float) -> None:
    """Set the file's last write time ``days`` back."""
    then = time.time() - days * DAY_S
    os.utime(path, (then, then))


async def test_an_object_a_day_old_is_written_again_before_its_reference_goes_out(
    store_url: str,
) -> None:
    """The object is read back, digest checked, and written again: its last write is now."""
    writer = offloader(store_url, refresh_after_s=0.0)  # every object counts as a day old
    value, headers = await written(writer)
    before_s = int(time.time())  # S3 keeps whole seconds
    await writer.keep("up.dlq", value, headers)
    assert writer.counters.refreshed == 1
    store = open_store(store_url)
    key = ref.decode(value, headers).key
    stored = await store.head(key)
    assert stored is not None
    assert stored.last_modified.timestamp() >= before_s
    assert b"".join([c async for c in store.chunks(key, 1 << 20)]) == BODY


async def test_only_an_object_a_day_old_is_rewritten_and_a_young_one_is_asked_once(
    tmp_path: Path,
) -> None:
    """A 2-hour-old object is left alone and not asked about again; a 2-day-old one is rewritten.

    Before, a reference produced again never touched its object: a 2-day-old object stayed
    2 days old, so a purge going by the copy's age deleted what the copy points to.
    """
    url = f"file://{tmp_path}/payloads"
    writer = offloader(url)
    value, headers = await written(writer)
    path = tmp_path / "payloads" / ref.decode(value, headers).key
    counting = CountingStore(open_store(url))
    writer._stores[url] = counting  # count what the real store is asked
    writer._fresh_until.clear()  # as in another process than the writer's

    age(path, 2 / 24)
    await writer.keep("up", value, headers)
    await writer.keep("up", value, headers)
    assert (counting.heads, counting.puts, writer.counters.refreshed) == (1, 0, 0)
    assert time.time() - path.stat().st_mtime > 3600

    writer._fresh_until.clear()  # a day later, as far as this process knows
    age(path, 2)
    await writer.keep("up", value, headers)
    assert (counting.heads, counting.puts, writer.counters.refreshed) == (2, 1, 1)
    assert time.time() - path.stat().st_mtime < 3600
    assert path.read_bytes() == BODY


async def test_a_gone_or_changed_object_is_left_to_the_member_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing is written for a missing or corrupt object; the producer is not stopped."""
    url = f"file://{tmp_path}/payloads"
    writer = offloader(url, refresh_after_s=0.0)
    value, headers = await written(writer)
    path = tmp_path / "payloads" / ref.decode(value, headers).key
    path.write_bytes(b"q" * len(BODY))  # changed under its reference
    with caplog.at_level(logging.WARNING, logger="pipeline.offload.writer"):
        await writer.keep("up", value, headers)
        path.unlink()
        await writer.keep("up", value, headers)
    assert writer.counters.refreshed == 0
    assert not path.exists()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert all("dead letter" in w for w in warnings)


async def test_a_reference_outside_the_topics_store_or_policy_is_not_touched(
    tmp_path: Path,
) -> None:
    """Another store's reference, or a topic without offload, costs no store call."""
    url = f"file://{tmp_path}/payloads"
    writer = offloader(url, refresh_after_s=0.0)
    value, headers = await written(writer)
    counting = CountingStore(open_store(url))
    writer._stores[url] = counting  # count what the real store is asked
    foreign, foreign_headers = ref.reference_for("s3://elsewhere/p", BODY).encode()
    await writer.keep("up", foreign, foreign_headers)
    await writer.keep("plain", value, headers)
    assert counting.heads == 0


@pytest.mark.usefixtures("s3_down_port")
async def test_an_unreachable_store_stops_the_reference() -> None:
    """The store is down: OffloadError, so the caller does not produce the copy unchecked."""
    url = "s3://pipeline/down"
    value, headers = ref.reference_for(url, BODY).encode()
    with pytest.raises(OffloadError, match="cannot read"):
        await offloader(url).keep("up", value, headers)


class Recorded:
    """The producer behind the offloading one: keeps what it is asked to send."""

    def __init__(self) -> None:
        """Nothing sent yet."""
        self.sent: list[tuple[str, Record]] = []

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: dict[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Delivered:
        """Record one message."""
        self.sent.append((topic, Record(value, key, headers, partition)))
        return Delivered(topic, 0, len(self.sent) - 1)

    async def send_many(self, topic: str, records: list[Record]) -> list[Delivered]:
        """Record a batch."""
        return [
            await self.send(topic, r.value, key=r.key, headers=dict(r.headers or {}))
            for r in records
        ]

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Nothing is buffered."""

    async def close(self) -> None:
        """Nothing to release."""


async def test_the_offloading_producer_keeps_a_reference_it_produces_again(
    tmp_path: Path,
) -> None:
    """Redrive, replay and the sweeper produce through it: the 2-day-old object is rewritten."""
    url = f"file://{tmp_path}/payloads"
    writer = offloader(url)
    value, headers = await written(writer)
    path = tmp_path / "payloads" / ref.decode(value, headers).key
    writer._fresh_until.clear()  # another process than the writer's
    age(path, 2)
    inner = Recorded()
    producer = OffloadingProducer(inner, writer)  # type: ignore[arg-type]
    await producer.send_many("up", [Record(value, b"k", headers)])
    await producer.send("up", value, key=b"k", headers=headers)
    assert [(t, r.value) for t, r in inner.sent] == [("up", value), ("up", value)]
    assert writer.counters.refreshed == 1
    assert time.time() - path.stat().st_mtime < 3600


class FailingOnce(CountingStore):
    """A real store whose first HEAD fails as an unreachable store's does."""

    async def head(self, key: str) -> StoredObject | None:
        """Fail the first time, then ask the store."""
        self.heads += 1
        if self.heads == 1:
            raise OffloadError(f"offload store {self.url}: cannot read {key}: connection refused")
        return await self._inner.head(key)


async def test_a_retry_copy_waits_for_a_store_that_does_not_answer(tmp_path: Path) -> None:
    """The member's routing retries a store error like a broker error, then sends the copy.

    The copy asks the store first (its object may need writing again); a store error that
    escaped the routing would fail the member's handling of the message instead of waiting.
    """
    url = f"file://{tmp_path}/payloads"
    spec = TopicSpec.model_validate(
        {
            "name": "up",
            "partitions": 1,
            "retry": {"tiers": ["1s"], "max_attempts": 3},
            "offload": {"above": "256KiB", "store": url},
        }
    )
    app = App([spec])

    @app.handler("up")
    async def handle(event: bytes, ctx: Context) -> None:
        """Never called here."""

    value, headers = await written(offloader(url))
    # Without written_ms (a reference from before it), the copy must wait for the store.
    value, headers = dataclasses.replace(ref.decode(value, headers), written_ms=None).encode()
    inner = Recorded()
    (lane,) = app.lanes.values()
    routed = offloading(inner, [lane.spec])  # type: ignore[arg-type]
    assert isinstance(routed, OffloadingProducer)
    store = FailingOnce(open_store(url))
    routed._offloader._stores[url] = store  # the member's offloader, its store failing once
    routing = Redirector(RetryRouter(routed), Stats(), default_retryable, [lane])
    message = Message("up", 0, 7, b"k", value, headers)
    outcome = await routing.failure(lane, message, 1, RuntimeError("downstream"))
    assert outcome == "retried"
    assert store.heads == 2
    assert [(topic, r.value) for topic, r in inner.sent] == [(spec.retry_topic_names()[0], value)]
