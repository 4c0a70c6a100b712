"""The offload purge keeps what a log row not yet processed or abandoned points to.

``pipeline purge`` deletes only finished rows, so a row still ``received`` or ``produced`` (its
members do not mark rows processed, or it is stuck) outlives the log's declared retention, and
the sweeper or ``pipeline replay`` may still produce it. Before, the offload purge went by the
declared retention and the broker alone: it deleted such a row's object, and the replayed row
became a ``payload_missing`` dead letter, its webhook gone for good.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from logstore.helpers import real_log_store
from offload.helpers import closed_port, declared
from redis.asyncio import Redis
from runtime.helpers import FAST, eventually, running

from pipeline.ingress.replay import replay
from pipeline.logstore import LogStore, NewRow, Selection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.offload import reference as ref
from pipeline.offload.lazy import LazyPayload
from pipeline.offload.purge import (
    floor_ms,
    measured_floor_ms,
    oldest_unfinished_row_ms,
    purge,
)
from pipeline.offload.rows import offload_row
from pipeline.offload.store import open_store
from pipeline.offload.writer import Offloader, OffloadingProducer, topic_policies
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport

DAY_MS = 86_400_000
PAYLOAD = b"w" * 300_000


def lane_doc(name: str, store_url: str) -> dict[str, object]:
    """A lane offloading bodies over 256 KiB to ``store_url``."""
    return {
        "name": name,
        "partitions": 1,
        "retry": {"tiers": ["200ms"], "max_attempts": 2},
        "offload": {"above": "256KiB", "store": store_url},
    }


async def offloaded_row(log: LogStore, spec: TopicSpec, received_at_ms: int) -> NewRow:
    """A webhook of ``PAYLOAD`` offloaded and logged by the ingress, produced, never processed."""
    row = NewRow(
        id=uuid.uuid4().hex,
        source="meta",
        tenant="t1",
        key="k",
        topic=spec.name,
        lane=spec.lane,
        event_id=f"ev-{uuid.uuid4().hex}",
        received_at_ms=received_at_ms,
        headers={"content-type": "application/json"},
        body=PAYLOAD,
    )
    row = await offload_row(Offloader(topic_policies([spec])), row)
    assert ref.is_reference({k: v.encode() for k, v in row.headers.items()})
    assert await log.insert(row)
    await log.mark_produced([row.id])
    return row


async def test_a_produced_rows_object_outlives_the_purge_and_its_replay_is_handled(
    tmp_path: Path, transport: Transport, redis: Redis, unique: str
) -> None:
    """A row produced 40 days ago and never processed: its object is kept, its replay handled.

    `pipeline offload purge` reads the log the ingress settings name; its floor (31 days
    declared) grows to the row's age plus a day, with one line saying so, and a younger
    ``--older-than`` is refused. Before, the object was deleted and the replay dead-lettered.
    """
    url = f"file://{tmp_path}/payloads"
    doc = lane_doc(f"unfinished_{unique}", url)
    spec = TopicSpec.model_validate(doc)
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "lane.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    log = SqliteLogStore(tmp_path / "ingress.db")
    await log.open()
    forty_days_ago_ms = int(time.time() * 1000) - 40 * DAY_MS
    row = await offloaded_row(log, spec, forty_days_ago_ms)
    path = tmp_path / "payloads" / _key(row)
    os.utime(path, (forty_days_ago_ms / 1000, forty_days_ago_ms / 1000))  # written with the row
    env = {
        **os.environ,
        "PIPELINE_TOPICS_DIR": str(topics),
        "PIPELINE_TRANSPORT": "kafka" if "Kafka" in type(transport).__name__ else "redis",
        "PIPELINE_INGRESS__LOG_STORE": "sqlite",
        "PIPELINE_INGRESS__SQLITE_PATH": str(tmp_path / "ingress.db"),
    }

    async def offload_purge(*args: str) -> tuple[int, str, str]:
        command = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pipeline",
            "offload",
            "purge",
            *args,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(command.communicate(), 120)
        assert command.returncode is not None
        return command.returncode, out.decode(), err.decode()

    async with declared(transport, redis, unique, spec):
        code, _, refused = await offload_purge("--older-than", "35d", "--dry-run")
        assert code == 2, refused
        assert "log row not yet processed or abandoned" in refused
        code, out, said = await offload_purge()
        assert code == 0, said
        line = json.loads(out)
        assert (line["scanned"], line["deleted"], line["kept"]) == (1, 0, 1), (line, said)
        assert len(said.strip().splitlines()) == 1, said
        assert "neither processed nor abandoned" in said
        assert path.read_bytes() == PAYLOAD

        producer = OffloadingProducer(transport.producer(), Offloader(topic_policies([spec])))
        summary = await replay(log, producer, Selection(ids=(row.id,)))
        await producer.close()
        assert summary.replayed == 1

        calls: list[bytes] = []
        app = App([spec])

        @app.handler(spec.lane)
        async def handle(event: LazyPayload, ctx: Context) -> None:
            calls.append(await event.read())  # the handler reads the object: it must be there

        group = f"g-{unique}"
        member = Member(app, transport, group, FAST, redis=redis, redis_prefix=unique)
        async with running(member):
            await eventually(lambda: bool(calls) or member.stats.dead_lettered > 0)
        await transport.admin().delete_group(group, spec.topic_names())
        assert member.stats.dead_lettered == 0  # before: a payload_missing dead letter
        assert calls == [PAYLOAD]
    await log.close()


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_the_floor_reaches_the_oldest_unfinished_row_on_s3(
    store_url: str, kind: str, tmp_path: Path, postgres_service: str
) -> None:
    """35 days on, a produced row's object on S3Proxy is kept; once finished, it can go.

    The declared floor is 31 days: before, the purge deleted the object of a row received 35
    days earlier although a replay could still produce it.
    """
    spec = TopicSpec.model_validate(lane_doc("up", store_url))
    store = open_store(store_url)
    async with real_log_store(kind, tmp_path, postgres_service) as log:
        now_ms = int(time.time() * 1000)
        row = await offloaded_row(log, spec, now_ms)
        declared_ms = floor_ms([spec], store_url, 30 * DAY_MS)
        assert declared_ms == 31 * DAY_MS
        later_ms = now_ms + 35 * DAY_MS
        # 10 days on, the declared floor covers the row: the log is not even asked for it.
        assert await oldest_unfinished_row_ms(log, declared_ms, now_ms + 10 * DAY_MS) is None
        oldest = await oldest_unfinished_row_ms(log, declared_ms, later_ms)
        assert oldest == row.received_at_ms
        floor = measured_floor_ms(declared_ms, oldest, later_ms)
        assert floor == 36 * DAY_MS
        report = await purge(store, floor, now_s=later_ms / 1000)
        assert (report.scanned, report.deleted, report.kept) == (1, 0, 1)
        assert await store.head(_key(row)) is not None
        await log.mark_processed([row.id])
        assert await oldest_unfinished_row_ms(log, declared_ms, later_ms) is None
        report = await purge(store, declared_ms, now_s=later_ms / 1000)
        assert report.deleted == 1


def _key(row: NewRow) -> str:
    """The object key of ``row``'s reference."""
    return ref.decode(row.body, {k: v.encode() for k, v in row.headers.items()}).key


def test_an_unreachable_log_stops_the_purge(tmp_path: Path, redis_service: str) -> None:
    """A PostgreSQL log that does not answer: one line, nothing deleted (before: deleted blind)."""
    import subprocess  # noqa: PLC0415 - this test alone runs the command synchronously

    store = f"file://{tmp_path}/payloads"
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "up.yaml").write_text(yaml.safe_dump(lane_doc("up", store)), encoding="utf-8")
    old = tmp_path / "payloads" / "sha256" / "aa" / "old"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"a payload a stuck row may still point to")
    long_ago_s = time.time() - 400 * 86_400
    os.utime(old, (long_ago_s, long_ago_s))
    down = f"postgresql://pipeline:pipeline@127.0.0.1:{closed_port()}/pipeline"
    env = {
        **os.environ,
        "PIPELINE_TOPICS_DIR": str(topics),
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": redis_service,
        "PIPELINE_INGRESS__LOG_STORE": "postgres",
        "PIPELINE_POSTGRES__URL": down,
        "PIPELINE_POSTGRES__CONNECT_TIMEOUT_S": "2",
    }
    stopped = subprocess.run(
        [sys.executable, "-m", "pipeline", "offload", "purge"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert stopped.returncode != 0, stopped.stdout
    assert stopped.stdout == ""
    assert len(stopped.stderr.strip().splitlines()) == 1, stopped.stderr
    assert "ingress log" in stopped.stderr
    assert "nothing was purged" in stopped.stderr
    assert old.exists()
