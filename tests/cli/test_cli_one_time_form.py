"""The commands print an instant one way: ISO 8601 in UTC to the millisecond, with ``Z``.

Before, ``pipeline redrive`` named a dead letter's time as ``...T05:40:00.123+00:00`` and
``pipeline offload purge`` a log row's as ``...T05:40:00Z`` (to the second), while ``pipeline
replay`` printed ``...T05:40:00.123Z``: an operator reading them side by side saw three forms of
the same instant, one of them rounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import yaml
from confluent_kafka import Producer as RawProducer
from runtime.helpers import declare, lane_spec
from support import delete_group_after

from pipeline import headers as h
from pipeline.config import Settings
from pipeline.logstore import NewRow
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.redrive.redrive import group_name
from pipeline.redrive.select import Selection
from pipeline.transport.protocol import Transport

DAY_MS = 86_400_000


async def pipeline(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """``pipeline ARGS`` as a user runs it: its exit code, stdout and stderr."""
    command = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "pipeline", *args),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(command.communicate(), 120)
    said = stderr.decode()
    assert "Traceback" not in said, said
    assert command.returncode is not None
    return command.returncode, stdout.decode(), said


async def test_a_dead_letter_and_a_log_row_of_the_same_instant_print_it_the_same_way(
    tmp_path: Path, kafka: Transport, settings: Settings, unique: str
) -> None:
    """A dead letter in Kafka and an unfinished log row, both of 40 days ago at .123 s.

    ``pipeline redrive --dry-run`` names the dead letter it would leave (no origin topic) with
    its time, ``pipeline offload purge`` the log row that holds its floor back with its time,
    ``pipeline replay`` the window it was given and ``pipeline tail`` the dead letter: the same
    text in all four. ``tail --json`` keeps its ``timestamp`` field as scripts read it.
    """
    now_ms = int(time.time() * 1000)
    instant_ms = (now_ms - 40 * DAY_MS) // 1000 * 1000 + 123
    shown = datetime.fromtimestamp(instant_ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.123Z")
    # Its dead letters are kept 90 days, so Kafka keeps one of 40 days ago.
    spec = lane_spec(f"iso_{unique}", 1, retention="90d")
    await declare(kafka, spec)
    dlq = spec.dead_letter
    delete_group_after(kafka, group_name(dlq, None, Selection.typed_as()), [dlq])
    offloaded = {  # never declared: the purge finds its topics hold nothing
        "name": f"iso_off_{unique}",
        "partitions": 1,
        "offload": {"above": "256KiB", "store": f"file://{tmp_path}/payloads"},
    }
    (tmp_path / "payloads").mkdir()
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "lane.yaml").write_text(f"name: {spec.name}\npartitions: 1\nretention: 90d\n")
    (topics / "offloaded.yaml").write_text(yaml.safe_dump(offloaded))
    raw = RawProducer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    raw.produce(
        spec.dead_letter, b"v", key=b"k", headers={h.DEAD_REASON: b"fatal"}, timestamp=instant_ms
    )
    assert raw.flush(30) == 0
    log = SqliteLogStore(tmp_path / "ingress.db")
    await log.open()
    try:
        assert await log.insert(
            NewRow(
                id=uuid.uuid4().hex,
                source="meta",
                tenant="t1",
                key="k",
                topic=spec.name,
                lane=spec.lane,
                event_id=f"ev-{unique}",
                received_at_ms=instant_ms,
                headers={},
                body=b"{}",
            )
        )
    finally:
        await log.close()
    env = {
        **os.environ,
        "PIPELINE_TOPICS_DIR": str(topics),
        "PIPELINE_TRANSPORT": "kafka",
        "PIPELINE_INGRESS__LOG_STORE": "sqlite",
        "PIPELINE_INGRESS__SQLITE_PATH": str(tmp_path / "ingress.db"),
    }

    code, _, redriven = await pipeline(env, "redrive", dlq, "--dry-run")
    assert code == 0, redriven
    assert f"(key b'k', dead-lettered {shown}): would stay in the DLQ" in redriven, redriven
    code, _, purged = await pipeline(env, "offload", "purge", "--dry-run")
    assert code == 0, purged
    assert f"the ingress log still holds a row received {shown} that" in purged, purged
    # The floor it measured is in days and hours, rounded up, not a count of milliseconds.
    assert re.search(r"kept every object written in the last 4\dd( \d+h)?, not ", purged), purged
    # An explicit --since and an age: the replay says the window first, then refuses rows older
    # than the consumers' idempotency memory (exit 2), replaying nothing.
    typed = datetime.fromtimestamp(instant_ms / 1000, UTC).isoformat(timespec="milliseconds")
    code, _, replayed = await pipeline(env, "replay", "--since", typed, "--until", "1m")
    assert code == 2, replayed
    assert f"replaying rows received since {shown} before " in replayed, replayed
    code, tailed, said = await pipeline(env, "tail", dlq, "--from-beginning", "--limit", "1")
    assert code == 0, said
    assert tailed.startswith(f"{dlq}[0]@0 {shown} key=k "), tailed
    code, tailed, said = await pipeline(
        env, "tail", dlq, "--from-beginning", "--limit", "1", "--json"
    )
    assert code == 0, said
    assert json.loads(tailed)["timestamp"] == typed
