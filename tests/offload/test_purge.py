"""The purge deletes only objects older than what the lanes, dead letters and log may still read."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from contract.helpers import consume_until
from offload.helpers import declared, offload_lane
from redis.asyncio import Redis

from pipeline.envelope import TopicPartition
from pipeline.errors import TransportError
from pipeline.offload import reference as ref
from pipeline.offload.directory import DirectoryPayloadStore
from pipeline.offload.policy import OffloadPolicy
from pipeline.offload.purge import (
    floor_ms,
    measured_floor_ms,
    oldest_held_ms,
    purge,
    topics_of,
)
from pipeline.offload.s3 import S3PayloadStore
from pipeline.offload.store import PayloadStore, StoredObject, open_store
from pipeline.offload.writer import Offloader
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import PartitionLag, Transport

DAY_MS = 86_400_000


def test_the_floor_is_the_longest_retention_plus_the_refresh_window() -> None:
    """Lane retention, the 14-day DLQ and the log's 30 days: the longest, plus one day."""
    spec = TopicSpec.model_validate(
        {"name": "up", "partitions": 1, "retention": "40d", "offload": {"store": "file:///p"}}
    )
    assert floor_ms([spec], "file:///p", 30 * DAY_MS) == 41 * DAY_MS
    assert floor_ms([spec], "file:///other", 30 * DAY_MS) == 31 * DAY_MS


async def test_purge_deletes_what_is_older_than_the_age(store_url: str) -> None:
    """Objects older than the age go (a dry run only counts them); younger ones stay."""
    store = open_store(store_url)
    reference = ref.reference_for(store_url, b"z" * 5000)
    await store.put(reference.key, b"z" * 5000)
    later_s = time.time() + 3600
    dry = await purge(store, 1000, dry_run=True, now_s=later_s)
    assert (dry.scanned, dry.deleted, dry.kept) == (1, 1, 0)
    assert await store.head(reference.key) is not None
    young = await purge(store, 2 * 3_600_000, now_s=later_s)
    assert (young.deleted, young.kept) == (0, 1)
    done = await purge(store, 1000, now_s=later_s)
    assert (done.deleted, done.deleted_bytes) == (1, 5000)
    assert await store.head(reference.key) is None


class _RewrittenWhileListed:
    """A real store whose object a writer rewrites once the purge has listed it."""

    def __init__(self, inner: PayloadStore, key: str, body: bytes) -> None:
        self._inner, self._key, self._body = inner, key, body

    async def list(self, prefix: str) -> AsyncIterator[StoredObject]:
        async for obj in self._inner.list(prefix):
            yield obj
        await self._inner.put(self._key, self._body)  # refreshed for a new reference

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_an_object_rewritten_after_the_listing_is_kept(tmp_path: Path) -> None:
    """A 40-day-old object a writer refreshes during the purge stays: a new message needs it.

    The purge deleted what its listing found old, so the body of a message accepted meanwhile
    (identical bodies share one object) was lost.
    """
    store = open_store(f"file://{tmp_path}/payloads")
    body = b"y" * 5000
    reference = ref.reference_for(store.url, body)
    await store.put(reference.key, body)
    path = tmp_path / "payloads" / reference.key
    old_s = time.time() - 40 * 86_400
    os.utime(path, (old_s, old_s))
    report = await purge(_RewrittenWhileListed(store, reference.key, body), 31 * DAY_MS)  # type: ignore[arg-type]
    assert (report.deleted, report.kept) == (0, 1)
    assert await store.head(reference.key) is not None


class _RewrittenOnceLookedAt(DirectoryPayloadStore):
    """A real directory store whose object a writer rewrites right after the purge looks at it."""

    def __init__(self, url: str, body: bytes) -> None:
        super().__init__(url)
        self._body = body

    async def head(self, key: str) -> StoredObject | None:
        found = await super().head(key)
        await self.put(key, self._body)  # refreshed for a new reference
        return found


async def test_an_object_rewritten_after_the_purge_looked_at_it_is_kept(tmp_path: Path) -> None:
    """A 40-day-old file a writer rewrites between the purge's look and its delete stays."""
    url = f"file://{tmp_path}/payloads"
    body = b"w" * 5000
    store = _RewrittenOnceLookedAt(url, body)
    reference = ref.reference_for(url, body)
    await store.put(reference.key, body)
    path = tmp_path / "payloads" / reference.key
    old_s = time.time() - 40 * 86_400
    os.utime(path, (old_s, old_s))
    report = await purge(store, 31 * DAY_MS)
    assert (report.deleted, report.kept) == (0, 1)
    assert path.read_bytes() == body
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no tombstone left


class _Written:
    """An observer that tells when the writer's object was written; the rest is not expected."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def written(self, store: str, size: int) -> None:  # noqa: ARG002
        self.event.set()

    def reused(self, store: str) -> None: ...

    def fetched(self, store: str, size: int, duration_s: float) -> None: ...

    def missing(self, store: str) -> None: ...

    def purged(self, store: str, objects: int) -> None: ...


class _WriterBetweenLookAndDelete(S3PayloadStore):
    """A real S3 store whose purge lets a writer rewrite the object between look and delete."""

    def __init__(self, url: str, writer: Any) -> None:
        super().__init__(url)
        self._writer = writer
        self.task: asyncio.Task[Any] | None = None
        self.deleted = asyncio.Event()
        self.written = _Written()
        self.writer_done_at_delete = False

    async def head(self, key: str) -> StoredObject | None:
        found = await super().head(key)
        if self.task is None:  # the purge's look: the writer writes before the purge deletes
            self.task = asyncio.create_task(self._writer())
            await self.written.event.wait()
        return found

    async def delete(self, key: str) -> None:
        self.writer_done_at_delete = self.task is not None and self.task.done()
        await super().delete(key)
        self.deleted.set()


async def test_a_body_written_again_during_the_purge_survives_on_s3(store_url: str) -> None:
    """A writer that rewrites an old object the purge is deleting writes it again after.

    The writer answers at once; its look after the rewrite runs beside it (settle waits for it).
    """
    if not store_url.startswith("s3://"):
        pytest.skip("the S3 writer's check after a rewrite")
    body = b"s" * 5000
    reference = ref.reference_for(store_url, body)
    offloader = Offloader({"up": OffloadPolicy(above=1024, store=store_url)}, refresh_after_s=0)
    store = _WriterBetweenLookAndDelete(
        store_url, lambda: offloader.offload("up", body, sha256=reference.sha256)
    )
    offloader._stores[store_url] = store  # one pool of connections, closed with the loop
    offloader.observer = store.written
    offloader.purgeable_after_s = 0.0  # this object is as old as the purge wants it

    async def until_deleted(seconds: float) -> None:
        await store.deleted.wait()

    offloader.pause = until_deleted
    await store.put(reference.key, body)
    report = await purge(store, 1000, now_s=time.time() + 3600)
    assert store.task is not None
    await store.task
    assert store.writer_done_at_delete  # the writer did not wait for its look to answer
    await offloader.settle()
    assert report.deleted == 1  # the purge deleted it under the writer ...
    assert await store.head(reference.key) is not None  # ... which wrote it again
    assert b"".join([c async for c in store.chunks(reference.key, 1 << 20)]) == body


def test_the_command_refuses_an_age_younger_than_the_floor(
    tmp_path: Path, redis_service: str
) -> None:
    """`pipeline offload purge --older-than 1d` is one line and exit 2; the default runs.

    The default asks the transport (here Redis) for the oldest message the lane still holds;
    with the transport down, the purge stops with one line saying so, deleting nothing.
    """
    topics = tmp_path / "topics"
    topics.mkdir()
    store = f"file://{tmp_path}/payloads"
    (topics / "up.yaml").write_text(
        yaml.safe_dump({"name": "up", "partitions": 1, "offload": {"store": store}})
    )
    env = {
        **os.environ,
        "PIPELINE_TOPICS_DIR": str(topics),
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": redis_service,
    }
    cli = [sys.executable, "-m", "pipeline", "offload", "purge"]
    refused = subprocess.run(
        [*cli, "--older-than", "1d"], check=False, env=env, capture_output=True, text=True
    )
    assert refused.returncode == 2
    assert "younger than what" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    ran = subprocess.run(cli, env=env, capture_output=True, text=True, check=True)
    assert '"deleted": 0' in ran.stdout
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        down = f"redis://127.0.0.1:{probe.getsockname()[1]}/0"
    stopped = subprocess.run(
        cli, check=False, env={**env, "PIPELINE_REDIS__URL": down}, capture_output=True, text=True
    )
    assert stopped.returncode != 0
    assert stopped.stdout == ""
    assert len(stopped.stderr.strip().splitlines()) == 1
    assert down.rsplit("/", 1)[0].removeprefix("redis://") in stopped.stderr
    chosen = subprocess.run(  # --transport wins over PIPELINE_TRANSPORT (here a Kafka that is down)
        [*cli, "--transport", "redis", "--dry-run"],
        env={
            **env,
            "PIPELINE_TRANSPORT": "kafka",
            "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
        },
        capture_output=True,
        text=True,
        check=True,
    )
    assert '"dry_run": true' in chosen.stdout


async def test_the_floor_grows_to_the_oldest_message_its_lanes_still_hold(
    tmp_path: Path, transport: Transport, redis: Redis, unique: str
) -> None:
    """A dead letter still held 35 days on keeps its payload: the floor is its age plus a day.

    Redis Streams keeps messages by count, not age, and a Kafka topic can be kept longer than
    declared. Before, the floor was the declared one alone (31 days here), so 35 days after
    this dead letter was produced its payload was deleted while the dead letter still pointed
    to it.
    """
    url = f"file://{tmp_path}/payloads"
    spec = offload_lane(f"held_{unique}", url)
    store = open_store(url)
    body = b"h" * 300_000
    reference = ref.reference_for(url, body)
    await store.put(reference.key, body)
    value, headers = reference.encode()
    async with declared(transport, redis, unique, spec):
        producer = transport.producer()
        await producer.send(spec.dead_letter, value, key=b"k", headers=headers)
        await producer.send(spec.name, b"small", key=b"k")
        await producer.close()
        reader = transport.consumer(f"read-{unique}", [spec.dead_letter, spec.name])
        got = await consume_until(reader, lambda r: len(r) >= 2)
        await reader.close()
        admin = transport.admin()
        oldest = await oldest_held_ms(admin, topics_of([spec], url))
        await admin.delete_group(f"read-{unique}", [spec.dead_letter, spec.name])
    assert topics_of([spec], url) == sorted(spec.topic_names())
    assert oldest == min(m.timestamp_ms for m in got)
    later_ms = oldest + 35 * DAY_MS
    declared_ms = floor_ms([spec], url, 30 * DAY_MS)
    assert declared_ms == 31 * DAY_MS
    floor = measured_floor_ms(declared_ms, oldest, later_ms)
    assert floor == 36 * DAY_MS
    too_early = await purge(store, declared_ms, now_s=later_ms / 1000, dry_run=True)
    assert too_early.deleted == 1  # what the declared floor alone would have deleted
    report = await purge(store, floor, now_s=later_ms / 1000)
    assert (report.deleted, report.kept) == (0, 1)
    assert await store.head(reference.key) is not None


def test_the_declared_floor_stands_when_nothing_older_is_held() -> None:
    """Nothing held, or only younger messages: the declared floor."""
    assert measured_floor_ms(31 * DAY_MS, None, 100 * DAY_MS) == 31 * DAY_MS
    assert measured_floor_ms(31 * DAY_MS, 99 * DAY_MS, 100 * DAY_MS) == 31 * DAY_MS


class _Unread:
    """An admin whose lag read found messages but could not read the oldest one's time."""

    async def group_lag(self, group: str, topic: str) -> list[PartitionLag]:  # noqa: ARG002
        """One partition holding offsets 4 to 9, its oldest timestamp unknown."""
        return [PartitionLag(TopicPartition(topic, 0), None, 10, None, 4)]


async def test_an_unread_oldest_message_stops_the_purge() -> None:
    """Held messages whose age is unknown: an error naming the partition, never a guess."""
    with pytest.raises(TransportError, match=r"up\[0\] holds messages from offset 4"):
        await oldest_held_ms(_Unread(), ["up"])  # type: ignore[arg-type]


def test_a_store_given_with_a_trailing_slash_keeps_its_lanes_floor(
    tmp_path: Path, redis_service: str
) -> None:
    """`--store file:///dir/` is the lane's `file:///dir`: its 90-day retention still counts."""
    topics = tmp_path / "topics"
    topics.mkdir()
    store = f"file://{tmp_path}/payloads"
    spec = {"name": "kept", "partitions": 1, "retention": "90d", "offload": {"store": store}}
    (topics / "kept.yaml").write_text(yaml.safe_dump(spec))
    held = tmp_path / "payloads" / "sha256" / "aa" / "held"
    held.parent.mkdir(parents=True)
    held.write_bytes(b"a payload a 90-day lane may still point to")
    forty_days_ago_s = time.time() - 40 * 86_400
    os.utime(held, (forty_days_ago_s, forty_days_ago_s))
    env = {
        **os.environ,
        "PIPELINE_TOPICS_DIR": str(topics),
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": redis_service,
    }
    for given in (store, f"{store}/"):
        ran = subprocess.run(
            [sys.executable, "-m", "pipeline", "offload", "purge", "--store", given, "--dry-run"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert '"deleted": 0' in ran.stdout, given
        assert f'"store": "{store}"' in ran.stdout


def test_a_purge_stopped_by_ctrl_c_says_what_it_deleted(tmp_path: Path, redis_service: str) -> None:
    """Ctrl-C during `pipeline offload purge` prints the store's line so far and how to finish."""
    topics = tmp_path / "topics"
    topics.mkdir()
    root = tmp_path / "payloads"
    store = f"file://{root}"
    (topics / "up.yaml").write_text(
        yaml.safe_dump({"name": "up", "partitions": 1, "offload": {"store": store}})
    )
    old_s = time.time() - 400 * 86_400
    count = 20_000  # a few seconds of deletes: the signal comes while they go on
    for n in range(count):
        path = root / "sha256" / f"{n % 256:02x}" / f"{n:064x}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"p")
        os.utime(path, (old_s, old_s))
    env = {
        **os.environ,
        "PIPELINE_TOPICS_DIR": str(topics),
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": redis_service,
    }
    purging = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "offload", "purge"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while sum(len(files) for _, _, files in os.walk(root)) == count:
            assert purging.poll() is None, purging.communicate()
            assert time.monotonic() < deadline, "the purge deleted nothing in 60 s"
            time.sleep(0.02)
    finally:
        purging.send_signal(signal.SIGINT)
        out, err = purging.communicate(timeout=60)
    assert purging.returncode == 130, (out, err)
    assert "Traceback" not in err, err
    left = sum(len(files) for _, _, files in os.walk(root))
    line = json.loads(out)
    assert line["store"] == store
    assert line["interrupted"] is True
    assert 0 < line["deleted"] <= count - left <= line["deleted"] + 1  # one may be under way
    assert len(err.strip().splitlines()) == 1
    assert "stopped by Ctrl-C" in err
    assert "run it again" in err
