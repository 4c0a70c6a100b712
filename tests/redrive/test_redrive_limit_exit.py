"""`pipeline redrive`'s exit code and last line tell "all moved" from "some left" (Kafka).

``--limit N`` moves N dead letters (those left in the DLQ do not count): a run stopped there
with dead letters still unread exits 3 (the same command again continues), one that left
selected dead letters in the DLQ exits 4 (they need another command), one that moved
everything it selected, to the end, exits 0. So ``until pipeline redrive ...; do ...; done``
stops only once a run had nothing left.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redrive.helpers import dead_letter_lane
from runtime.helpers import produce
from support import delete_group_after

from pipeline import headers as h
from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.redrive.redrive import group_name
from pipeline.redrive.select import Selection
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport


@pytest.fixture
async def kafka(settings: Settings, kafka_service: str) -> AsyncIterator[Transport]:
    """The real Kafka transport."""
    transport = create_transport(settings, "kafka")
    yield transport
    await transport.close()


async def fill(
    kafka: Transport, unique: str, tmp_path: Path, origins: list[str | None]
) -> TopicSpec:
    """A one-partition lane declared, with a dead letter for each of ``origins`` (None: none)."""
    spec, dlq, headers = await dead_letter_lane(kafka, unique, 1)
    (tmp_path / "lane.yaml").write_text(f"name: {spec.name}\npartitions: 1\n", encoding="utf-8")
    records = []
    for i, origin in enumerate(origins):
        dead = {**headers, h.EVENT_ID: b"e%d" % i}
        if origin is None:
            del dead[h.ORIGIN_TOPIC]
        else:
            dead[h.ORIGIN_TOPIC] = origin.encode()
        records.append(Record(b"v%d" % i, b"k%d" % i, dead))
    await produce(kafka, dlq, records)
    delete_group_after(kafka, group_name(dlq, None, Selection.typed_as()), [dlq])
    return spec


async def redrive(tmp_path: Path, dlq: str, *options: str) -> tuple[int, list[str]]:
    """``pipeline redrive DLQ -t kafka OPTIONS``: its exit code and stdout lines."""
    env = {**os.environ, "PIPELINE_TOPICS_DIR": str(tmp_path)}
    command = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "pipeline", "redrive", dlq, "-t", "kafka", *options),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(command.communicate(), 120)
    assert b"Traceback" not in stderr, stderr.decode()
    assert command.returncode is not None
    return command.returncode, stdout.decode().splitlines()


async def moved_to(kafka: Transport, spec: TopicSpec) -> int:
    """How many messages the lane's topic holds."""
    return (await kafka.admin().list_topics([spec.name]))[spec.name].message_count


async def test_a_run_stopped_at_its_limit_says_so_and_exits_3_until_the_last(
    kafka: Transport, unique: str, tmp_path: Path
) -> None:
    """Five dead letters, --limit 2: runs exit 3, 3, then 0, the last line saying which."""
    spec = await fill(kafka, unique, tmp_path, [f"rd_{unique}"] * 5)
    runs = [await redrive(tmp_path, spec.dead_letter, "--limit", "2") for _ in range(3)]
    assert [code for code, _ in runs] == [3, 3, 0]
    again = "run the same command again to continue (exit 3)"
    assert [lines[-1] for _, lines in runs] == [
        f"stopped at --limit 2 with 3 dead letters of {spec.dead_letter} still unread: {again}",
        f"stopped at --limit 2 with 1 dead letter of {spec.dead_letter} still unread: {again}",
        "done: every selected dead letter was moved",
    ]
    assert await moved_to(kafka, spec) == 5


async def test_the_limit_counts_dead_letters_moved_not_those_left(
    kafka: Transport, unique: str, tmp_path: Path
) -> None:
    """--limit 2 over [no origin, ok, ok, ok] moves 2, and exits 4: one was left in the DLQ."""
    name = f"rd_{unique}"
    spec = await fill(kafka, unique, tmp_path, [None, name, name, name])
    code, lines = await redrive(tmp_path, spec.dead_letter, "--limit", "2")
    assert await moved_to(kafka, spec) == 2
    assert code == 4
    assert lines[-1] == (
        f"1 selected dead letter left in {spec.dead_letter} (each named in a warning above):"
        " the same command does not come back to it; 1 dead letter still unread: run the same"
        " command again for those (exit 4)"
    )


async def test_a_run_that_left_dead_letters_exits_4_and_its_rerun_0(
    kafka: Transport, unique: str, tmp_path: Path
) -> None:
    """[ok, no origin, ok]: both ok ones move, exit 4 naming the one left; a rerun exits 0."""
    name = f"rd_{unique}"
    spec = await fill(kafka, unique, tmp_path, [name, None, name])
    code, lines = await redrive(tmp_path, spec.dead_letter)
    assert await moved_to(kafka, spec) == 2
    assert code == 4
    assert lines[-1] == (
        f"1 selected dead letter left in {spec.dead_letter} (each named in a warning above):"
        " the same command does not come back to it (exit 4)"
    )
    assert (await redrive(tmp_path, spec.dead_letter))[0] == 0
