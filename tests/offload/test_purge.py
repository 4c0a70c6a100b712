"""The purge deletes only objects older than what the lanes, dead letters and log may still read."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from pipeline.offload import reference as ref
from pipeline.offload.purge import floor_ms, purge
from pipeline.offload.store import PayloadStore, StoredObject, open_store
from pipeline.topics.spec import TopicSpec

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


def test_the_command_refuses_an_age_younger_than_the_floor(tmp_path: Path) -> None:
    """`pipeline offload purge --older-than 1d` is one line and exit 2; the default runs."""
    topics = tmp_path / "topics"
    topics.mkdir()
    store = f"file://{tmp_path}/payloads"
    (topics / "up.yaml").write_text(
        yaml.safe_dump({"name": "up", "partitions": 1, "offload": {"store": store}})
    )
    env = {**os.environ, "PIPELINE_TOPICS_DIR": str(topics)}
    cli = [sys.executable, "-m", "pipeline", "offload", "purge"]
    refused = subprocess.run(
        [*cli, "--older-than", "1d"], check=False, env=env, capture_output=True, text=True
    )
    assert refused.returncode == 2
    assert "younger than what" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    ran = subprocess.run(cli, env=env, capture_output=True, text=True, check=True)
    assert '"deleted": 0' in ran.stdout
