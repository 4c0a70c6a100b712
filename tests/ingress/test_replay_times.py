"""Times on the command line: `replay --since/--until` and `purge --older-than` as `redrive`.

A time without a zone is refused with one line asking for one, as ``pipeline redrive`` refuses
it, rather than read in a zone the operator did not say; a time with a zone is the same instant
in all three commands. Run through the CLI on both real log stores.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from logstore.helpers import FakeClock, new_row
from typer.testing import CliRunner

from pipeline.config import Settings
from pipeline.ingress.cli import ops_app
from pipeline.logstore import LogStore, Selection
from pipeline.logstore.postgres import PostgresLogStore
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.redrive.select import Selection as RedriveSelection
from pipeline.redrive.select import parse_time_ms

BOUNDARY_MS = int(datetime(2026, 12, 1, 10, tzinfo=UTC).timestamp() * 1000)
"""2026-12-01T10:00:00Z; the log holds a row 1 ms before it, one at it and one an hour after."""


@dataclass
class CliLog:
    """A log store the CLI opens through the environment, and a way to open it here too."""

    kind: str
    path: Path
    url: str
    schema: str

    def store(self) -> LogStore:
        """A new (unopened) store on the same database as the CLI's."""
        if self.kind == "sqlite":
            return SqliteLogStore(self.path)
        return PostgresLogStore(self.url, schema=self.schema)

    def rows(self) -> int:
        """How many rows the log holds."""

        async def count() -> int:
            store = self.store()
            await store.open()
            try:
                return sum((await store.count_by_state(Selection())).values())
            finally:
                await store.close()

        return asyncio.run(count())


@pytest.fixture(params=["sqlite", "postgres"])
def cli_log(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[CliLog]:
    """Each real log store, seeded with three abandoned rows around the boundary."""
    log = CliLog(
        request.param, tmp_path / "ingress.db", settings.postgres.url, f"t_{uuid.uuid4().hex[:12]}"
    )
    monkeypatch.setenv("PIPELINE_INGRESS__LOG_STORE", log.kind)
    monkeypatch.setenv("PIPELINE_INGRESS__SQLITE_PATH", str(log.path))
    if log.kind == "postgres":
        request.getfixturevalue("postgres_service")
        monkeypatch.setenv("PIPELINE_POSTGRES__URL", log.url)
        monkeypatch.setenv("PIPELINE_INGRESS__POSTGRES_SCHEMA", log.schema)

    async def seed() -> None:
        store = log.store()
        await store.open()
        try:
            clock = FakeClock(start_s=(BOUNDARY_MS - 1) / 1000)
            rows = []
            for n, step_s in enumerate((0.001, 3600, 0)):
                rows.append(new_row(n, clock))
                await store.insert(rows[-1])
                clock.advance(step_s)
            await store.abandon([row.id for row in rows], "poison")
        finally:
            await store.close()

    asyncio.run(seed())
    try:
        yield log
    finally:
        if log.kind == "postgres":
            with psycopg.connect(log.url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{log.schema}" CASCADE')


def dry_run_total(*args: str) -> int:
    """The total of ``replay --dry-run ARGS``."""
    result = CliRunner().invoke(ops_app, ["replay", "--dry-run", *args])
    assert result.exit_code == 0, result.output
    match = re.search(r"total\s*\W\s*(\d+)", result.output)
    assert match is not None, result.output
    return int(match[1])


@pytest.mark.parametrize("naive", ["2026-12-01T10:00", "2026-12-01T10:00:00.000", "2026-12-01"])
@pytest.mark.parametrize(
    "command",
    [
        ["replay", "--dry-run", "--since"],
        ["replay", "--dry-run", "--until"],
        ["purge", "--older-than"],
    ],
    ids=["replay-since", "replay-until", "purge-older-than"],
)
def test_a_time_without_a_zone_is_refused_with_one_line_asking_for_one(
    cli_log: CliLog, command: list[str], naive: str
) -> None:
    """Exit 2, one line naming the option and asking for a zone, and nothing purged.

    ``pipeline redrive`` refuses the same text the same way.
    """
    result = CliRunner().invoke(ops_app, [*command, naive])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert command[-1] in lines[0]
    assert "time zone" in lines[0]
    assert naive in lines[0]
    assert cli_log.rows() == 3
    with pytest.raises(ValueError, match="time zone"):
        RedriveSelection.typed_as(since=naive)


def test_a_time_with_a_zone_is_the_same_instant_in_replay_purge_and_redrive(
    cli_log: CliLog,
) -> None:
    """10:00Z, 12:00+02:00 and 05:00-05:00 all name the boundary, inclusive for --since."""
    for zoned in ("2026-12-01T10:00:00Z", "2026-12-01T12:00+02:00", "2026-12-01T05:00-05:00"):
        assert parse_time_ms(zoned) == BOUNDARY_MS
        assert dry_run_total("--since", zoned) == 2
        assert dry_run_total("--until", zoned) == 1
    purged = CliRunner().invoke(ops_app, ["purge", "--older-than", "2026-12-01T11:00+01:00"])
    assert purged.exit_code == 0, purged.output
    assert "purged 1 rows" in purged.output
    assert cli_log.rows() == 2


@pytest.mark.parametrize(
    ("command", "rows_left"),
    [
        (["replay", "--dry-run", "--since", "99999999999999999d"], None),
        (["replay", "--dry-run", "--until", "99999999999999999d"], None),
        (["replay", "--dry-run", "--idempotency-memory", "99999999999999999d"], None),
        (["purge", "--older-than", "99999999999999999d"], 3),
    ],
    ids=["replay-since", "replay-until", "replay-memory", "purge-older-than"],
)
def test_a_duration_reaching_before_1970_is_the_epoch_not_a_traceback(
    cli_log: CliLog, command: list[str], rows_left: int | None
) -> None:
    """An age longer than the clock reaches back means "since 1970": an answer, no overflow."""
    result = CliRunner().invoke(ops_app, command)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    if rows_left is not None:
        assert "purged 0 rows" in result.output
        assert cli_log.rows() == rows_left
