"""``pipeline redrive`` given a window that selects nothing, and a dry run that selected none.

``--since 1h --until 2h`` reads "from an hour ago to two hours ago": its start is after its end
(ages count back from now), so no dead letter can be in it; a ``--since`` after now the same.
The dry run scanned the DLQ, printed "selected 0" and exited 0, as if none had failed in that
hour. Such a window is refused before the broker is asked (exit 2, one line naming both options
and the window meant). A dry run that selected nothing printed an empty histogram, its title
wrapped over two lines; only its summary line is printed now.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from runtime.helpers import declare, lane_spec
from support import cli_environment, delete_group_after, run_pipeline

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.redrive.redrive import group_name
from pipeline.redrive.select import Selection
from pipeline.transport.protocol import Transport

TITLE = "selected dead letters"


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


@pytest.mark.parametrize(
    ("since", "until", "hint"),
    [
        ("1h", "2h", "ages count back from now: --since 2h --until 1h"),
        ("1h", "90m", "ages count back from now: --since 90m --until 1h"),
        (
            "2026-01-02T00:00:00+00:00",
            "2026-01-01T00:00:00+00:00",
            "--since 2026-01-01T00:00:00+00:00 --until 2026-01-02T00:00:00+00:00",
        ),
        ("1h", "1h", "give --since the earlier time"),
    ],
)
def test_a_window_whose_start_is_not_before_its_end_is_refused(
    since: str, until: str, hint: str, tmp_path: Path
) -> None:
    """Exit 2 before any broker is asked: one line naming both options and the window meant."""
    result = run_pipeline(
        *("redrive", "messages.dlq", "--since", since, "--until", until, "--dry-run"),
        env=cli_environment(tmp_path),
    )
    assert result.returncode == 2, f"{result.returncode}: {result.stdout}{result.stderr}"
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        f"error: --since {since} is not before --until {until}: the window selects nothing"
    ), line
    assert hint in line, line


def test_a_since_after_now_is_refused(tmp_path: Path) -> None:
    """An absolute --since tomorrow: no dead letter has arrived yet, exit 2 with one line."""
    tomorrow = _iso(datetime.now(UTC) + timedelta(days=1))
    result = run_pipeline(
        "redrive", "messages.dlq", "--since", tomorrow, "--dry-run", env=cli_environment(tmp_path)
    )
    assert result.returncode == 2, f"{result.returncode}: {result.stdout}{result.stderr}"
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: --since {tomorrow} is after now ("), line
    assert "selects nothing" in line, line


async def test_a_dry_run_that_selected_nothing_prints_no_table(
    tmp_path: Path, streams: Transport, unique: str
) -> None:
    """A DLQ whose one dead letter is another tenant's: the summary line, no empty table."""
    spec = lane_spec(f"w2win_{unique}", 1)
    await declare(streams, spec)
    dlq = spec.dead_letter
    producer = streams.producer()
    try:
        await producer.send_many(
            dlq, [Record(b"v", b"k", {h.DEAD_REASON: b"fatal", h.TENANT: b"a"})]
        )
    finally:
        await producer.close()
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "lane.yaml").write_text(f"name: {spec.name}\npartitions: 1\n", encoding="utf-8")
    env = cli_environment(tmp_path, PIPELINE_TOPICS_DIR=str(topics), PIPELINE_TRANSPORT="redis")
    for tenant in ("b", "a"):
        delete_group_after(streams, group_name(dlq, None, Selection.typed_as(tenant=tenant)), [dlq])

    none = run_pipeline("redrive", dlq, "--tenant", "b", "--dry-run", env=env)
    assert none.returncode == 0, none.stderr
    assert TITLE not in none.stdout, none.stdout
    assert none.stdout.startswith("scanned 1, selected 0, would move 0,"), none.stdout

    one = run_pipeline("redrive", dlq, "--tenant", "a", "--dry-run", env=env)
    assert one.returncode == 0, one.stderr
    assert TITLE in one.stdout, one.stdout
    assert "scanned 1, selected 1," in one.stdout, one.stdout
