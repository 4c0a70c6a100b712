"""`pipeline offload purge` with a mistyped flag where no lane declares ``offload:``.

The command looked for the stores before it read its flags, so ``--log-retention 90x`` or
``--older-than abc`` was answered "no lane in the topics directory declares offload: (give
--store)": the operator fixed the wrong thing, and then met the flag's error. That line did not
name the directory it had read either.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_status_missing_topics_exit import declare


def purge(*args: str, topics: Path) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline offload purge --dry-run ARGS`` over the topics directory ``topics``."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "offload", "purge", "--dry-run", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PIPELINE_TOPICS_DIR": str(topics)},
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--log-retention", "90x"], "error: --log-retention: expected a duration"),
        (["--older-than", "abc"], "error: --older-than: expected a duration"),
    ],
)
def test_a_bad_flag_is_named_before_the_stores_are_looked_for(
    args: list[str], expected: str, tmp_path: Path, unique: str
) -> None:
    """Exit 2, one line naming the flag, though no lane declares a store."""
    result = purge(*args, topics=declare(tmp_path / "topics", f"walk_{unique}"))
    assert result.returncode == 2, f"{result.returncode}: {result.stdout}{result.stderr}"
    (line,) = result.stderr.splitlines()
    assert line.startswith(expected), line


def test_no_store_names_the_topics_directory(tmp_path: Path, unique: str) -> None:
    """Without ``--store`` and no lane with ``offload:``: the directory read is named."""
    topics = declare(tmp_path / "topics", f"walk_{unique}")
    result = purge(topics=topics)
    assert result.returncode == 2, f"{result.returncode}: {result.stdout}{result.stderr}"
    (line,) = result.stderr.splitlines()
    assert f"no lane in {topics} declares offload:" in line, line
    assert "--store" in line, line
