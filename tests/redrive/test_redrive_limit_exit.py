"""`pipeline redrive`'s exit code and last line tell "all moved" from "some left" (both brokers).

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


@pytest.fixture(params=["kafka", "redis"])
async def transport(request: pytest.FixtureRequest, settings: Settings) -> AsyncIterator[Transport]:
    """Each real transport: Kafka, and Redis Streams (the unread count is offsets on both)."""
    request.getfixturevalue(f"{request.param}_service")
    made = create_transport(settings, request.param)
    yield made
    await made.close()


async def fill(
    transport: Transport, unique: str, tmp_path: Path, origins: list[str | None]
) -> TopicSpec:
    """A one-partition lane declared, with a dead letter for each of ``origins`` (None: none)."""
    spec, dlq, headers = await dead_letter_lane(transport, unique, 1)
    (tmp_path / "lane.yaml").write_text(f"name: {spec.name}\npartitions: 1\n", encoding="utf-8")
    records = []
    for i, origin in enumerate(origins):
        dead = {**headers, h.EVENT_ID: b"e%d" % i}
        if origin is None:
            del dead[h.ORIGIN_TOPIC]
        else:
            dead[h.ORIGIN_TOPIC] = origin.encode()
        records.append(Record(b"v%d" % i, b"k%d" % i, dead))
    await produce(transport, dlq, records)
    delete_group_after(transport, group_name(dlq, None, Selection.typed_as()), [dlq])
    return spec


async def redrive(
    transport: Transport, tmp_path: Path, dlq: str, *options: str
) -> tuple[int, list[str]]:
    """``pipeline redrive DLQ -t <the transport> OPTIONS``: its exit code and stdout lines."""
    env = {**os.environ, "PIPELINE_TOPICS_DIR": str(tmp_path)}
    command = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "pipeline", "redrive", dlq, "-t", transport.name, *options),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(command.communicate(), 120)
    assert b"Traceback" not in stderr, stderr.decode()
    assert command.returncode is not None
    return command.returncode, stdout.decode().splitlines()


async def moved_to(transport: Transport, spec: TopicSpec) -> int:
    """How many messages the lane's topic holds."""
    return (await transport.admin().list_topics([spec.name]))[spec.name].message_count


async def test_a_run_stopped_at_its_limit_says_so_and_exits_3_until_the_last(
    transport: Transport, unique: str, tmp_path: Path
) -> None:
    """Five dead letters, --limit 2: runs exit 3, 3, then 0, the last line saying which."""
    spec = await fill(transport, unique, tmp_path, [f"rd_{unique}"] * 5)
    runs = [await redrive(transport, tmp_path, spec.dead_letter, "--limit", "2") for _ in range(3)]
    assert [code for code, _ in runs] == [3, 3, 0]
    again = "run the same command again to continue (exit 3)"
    assert [lines[-1] for _, lines in runs] == [
        f"stopped at --limit 2 with 3 dead letters of {spec.dead_letter} still unread: {again}",
        f"stopped at --limit 2 with 1 dead letter of {spec.dead_letter} still unread: {again}",
        "done: every selected dead letter was moved",
    ]
    assert await moved_to(transport, spec) == 5


async def test_the_limit_counts_dead_letters_moved_not_those_left(
    transport: Transport, unique: str, tmp_path: Path
) -> None:
    """--limit 2 over [no origin, ok, ok, ok] moves 2, and exits 4: one was left in the DLQ."""
    name = f"rd_{unique}"
    spec = await fill(transport, unique, tmp_path, [None, name, name, name])
    code, lines = await redrive(transport, tmp_path, spec.dead_letter, "--limit", "2")
    assert await moved_to(transport, spec) == 2
    assert code == 4
    assert lines[-1] == (
        f"1 selected dead letter left in {spec.dead_letter} (each named in a warning above):"
        " the same command does not come back to it; 1 dead letter still unread: run the same"
        " command again for those (exit 4)"
    )


async def test_a_run_that_left_dead_letters_exits_4_and_its_rerun_0(
    transport: Transport, unique: str, tmp_path: Path
) -> None:
    """[ok, no origin, ok]: both ok ones move, exit 4 naming the one left; a rerun exits 0."""
    name = f"rd_{unique}"
    spec = await fill(transport, unique, tmp_path, [name, None, name])
    code, lines = await redrive(transport, tmp_path, spec.dead_letter)
    assert await moved_to(transport, spec) == 2
    assert code == 4
    assert lines[-1] == (
        f"1 selected dead letter left in {spec.dead_letter} (each named in a warning above):"
        " the same command does not come back to it (exit 4)"
    )
    assert (await redrive(transport, tmp_path, spec.dead_letter))[0] == 0


async def test_a_limit_reached_on_the_last_dead_letter_exits_0(
    transport: Transport, unique: str, tmp_path: Path
) -> None:
    """Two dead letters, --limit 2: both move and nothing is unread, so exit 0 at once."""
    spec = await fill(transport, unique, tmp_path, [f"rd_{unique}"] * 2)
    code, lines = await redrive(transport, tmp_path, spec.dead_letter, "--limit", "2")
    assert (code, lines[-1]) == (0, "done: every selected dead letter was moved")
    assert await moved_to(transport, spec) == 2


async def test_a_limit_reached_before_unmovable_dead_letters_exits_3_then_4_then_0(
    transport: Transport, unique: str, tmp_path: Path
) -> None:
    """[ok, no origin], --limit 1: 3 (one unread), then 4 (it is left), then 0 (nothing)."""
    name = f"rd_{unique}"
    spec = await fill(transport, unique, tmp_path, [name, None])
    runs = [await redrive(transport, tmp_path, spec.dead_letter, "--limit", "1") for _ in range(3)]
    assert [code for code, _ in runs] == [3, 4, 0]
    assert runs[0][1][-1].startswith("stopped at --limit 1 with 1 dead letter of")
    assert runs[1][1][-1].endswith("the same command does not come back to it (exit 4)")
    assert runs[2][1][-1] == "done: no dead letter selected"
    assert await moved_to(transport, spec) == 1


async def test_a_dry_run_exits_0_whatever_it_would_leave(
    transport: Transport, unique: str, tmp_path: Path
) -> None:
    """A dry run over [ok, no origin, ok] with --limit 1 moves nothing and exits 0."""
    name = f"rd_{unique}"
    spec = await fill(transport, unique, tmp_path, [name, None, name])
    code, _ = await redrive(transport, tmp_path, spec.dead_letter, "--limit", "1", "--dry-run")
    assert code == 0
    assert await moved_to(transport, spec) == 0
