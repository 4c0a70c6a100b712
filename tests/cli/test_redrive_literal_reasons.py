"""``pipeline redrive`` prints a dead letter's reason and error class as they are.

Both come from the dead letter's headers (``pl-dead-reason``, ``pl-error-class``), which any
client producing to the dead-letter topic sets. rich read ``[...]`` in them as markup: a reason
of ``[/x]`` stopped the dry run's histogram with a MarkupError traceback (exit 1), the moment an
operator wanted to see what failed.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from confluent_kafka import Producer as RawProducer
from runtime.helpers import declare, lane_spec
from support import delete_group_after

from pipeline import headers as h
from pipeline.config import Settings
from pipeline.redrive.redrive import group_name
from pipeline.redrive.select import Selection
from pipeline.transport.protocol import Transport

REASON = "fatal [/x] [bold]:smile:"
ERROR_CLASS = "app.[/]Error"


async def test_redrive_dry_run_prints_a_hostile_reason_literally(
    tmp_path: Path, kafka: Transport, settings: Settings, unique: str
) -> None:
    """A dead letter whose reason and error class hold markup: exit 0, both printed as sent."""
    spec = lane_spec(f"rvlit_{unique}", 1)
    await declare(kafka, spec)
    dlq = spec.dead_letter
    delete_group_after(kafka, group_name(dlq, None, Selection.typed_as()), [dlq])
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "lane.yaml").write_text(f"name: {spec.name}\npartitions: 1\n", encoding="utf-8")
    raw = RawProducer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    headers = {h.DEAD_REASON: REASON.encode(), h.ERROR_CLASS: ERROR_CLASS.encode()}
    raw.produce(dlq, b"v", key=b"k", headers=headers)
    assert raw.flush(30) == 0
    env = {
        **os.environ,
        "PIPELINE_TOPICS_DIR": str(topics),
        "PIPELINE_TRANSPORT": "kafka",
        "COLUMNS": "400",
    }
    command = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "pipeline", "redrive", dlq, "--dry-run"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(command.communicate(), 120)
    assert command.returncode == 0, err.decode()
    assert "Traceback" not in err.decode()
    assert f"{REASON}: {ERROR_CLASS}" in out.decode(), out.decode()
