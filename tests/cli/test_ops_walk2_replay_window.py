"""``pipeline replay`` given a window that selects nothing is refused (exit 2), as redrive's is.

"From an hour ago to two hours ago" (``--since 1h --until 2h``) is a window whose start is after
its end (ages count back from now); a ``--since`` after now the same. Replay read no row,
printed a table of 0 and exited 0, as if no request had come in then. ``pipeline redrive``
refuses such a window (tests/cli/test_ops_walk2_redrive_window.py) with the same line, from
:func:`pipeline.cli_support.require_window`; replay now checks it before any row is read.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support import cli_environment, run_pipeline

from pipeline.logstore.sqlite.store import SqliteLogStore


async def _environment(tmp_path: Path) -> dict[str, str]:
    """A SQLite log with no row: a window the check lets through reads it and exits 0."""
    log = SqliteLogStore(tmp_path / "ingress.db")
    await log.open()
    await log.close()
    return cli_environment(tmp_path, PIPELINE_INGRESS__LOG_STORE="sqlite")


async def test_replay_of_a_window_whose_start_is_not_before_its_end_is_refused(
    tmp_path: Path,
) -> None:
    """Exit 2, one line naming both options and the window meant; no row is read."""
    env = await _environment(tmp_path)
    result = run_pipeline("replay", "--since", "1h", "--until", "2h", "--dry-run", env=env)
    assert result.returncode == 2, f"{result.returncode}: {result.stdout}{result.stderr}"
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line == (
        "error: --since 1h is not before --until 2h: the window selects nothing"
        " (ages count back from now: --since 2h --until 1h)"
    ), line


@pytest.mark.parametrize(
    ("since", "until", "hint"),
    [
        ("1h", "1h", "both give the same time; give --since the earlier time"),
        (
            "2026-01-02T00:00:00+00:00",
            "2026-01-01T00:00:00+00:00",
            (
                "the earlier time goes to --since: --since 2026-01-01T00:00:00+00:00"
                " --until 2026-01-02T00:00:00+00:00"
            ),
        ),
    ],
)
async def test_replay_of_an_empty_window_names_the_window_meant(
    since: str, until: str, hint: str, tmp_path: Path
) -> None:
    """The same age twice (both count back from one instant) and two ISO times swapped."""
    env = await _environment(tmp_path)
    result = run_pipeline("replay", "--since", since, "--until", until, "--dry-run", env=env)
    assert result.returncode == 2, f"{result.returncode}: {result.stdout}{result.stderr}"
    (line,) = result.stderr.splitlines()
    assert line == (
        f"error: --since {since} is not before --until {until}: the window selects nothing ({hint})"
    ), line


async def test_replay_since_after_now_is_refused(tmp_path: Path) -> None:
    """An ISO --since tomorrow: no request has come in yet, exit 2 with one line."""
    env = await _environment(tmp_path)
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).isoformat(timespec="seconds")
    result = run_pipeline("replay", "--since", tomorrow, "--dry-run", env=env)
    assert result.returncode == 2, f"{result.returncode}: {result.stdout}{result.stderr}"
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: --since {tomorrow} is after now ("), line
    assert line.endswith(
        "the window selects nothing yet; give a time in the past, or an age (--since 2h)"
    ), line


async def test_replay_of_a_window_in_order_is_read(tmp_path: Path) -> None:
    """--since 2h --until 1h selects what came in then: the dry run reads the log, exit 0."""
    env = await _environment(tmp_path)
    result = run_pipeline("replay", "--since", "2h", "--until", "1h", "--dry-run", env=env)
    assert result.returncode == 0, f"{result.returncode}: {result.stdout}{result.stderr}"
    assert result.stderr == ""
    assert "dry run: rows matched" in result.stdout, result.stdout
