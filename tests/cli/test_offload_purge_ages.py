"""`pipeline offload purge` given ages longer than any clock reaches, or a store not there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HUGE = "1" + "0" * 400 + "d"
"""More days than a float of seconds holds."""


@pytest.mark.parametrize("option", ["--older-than", "--log-retention"])
def test_an_age_past_any_clock_deletes_nothing(
    redis_service: str, tmp_path: Path, option: str
) -> None:
    """An age longer ago than 1970 reaches no object: the purge deletes nothing, no traceback."""
    store = tmp_path / "payloads"
    store.mkdir()
    command = ["offload", "purge", "--store", f"file://{store}", option, HUGE, "--dry-run"]
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", *command, "-t", "redis"],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "PIPELINE_REDIS__URL": redis_service},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["deleted"] == 0


def test_a_store_directory_not_there_is_refused(tmp_path: Path) -> None:
    """A --store file:// directory that does not exist (a typo) is one line, exit 2, not created."""
    missing = tmp_path / "nonexistent"
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "offload", "purge", "--store", f"file://{missing}"],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "PIPELINE_REDIS__URL": "redis://127.0.0.1:1/0"},
        check=False,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: --store file://{missing}: no such directory"), lines
    assert not missing.exists()
