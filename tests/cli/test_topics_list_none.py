"""`pipeline topics list` on a broker with no topics: one line saying so and what creates them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_an_empty_broker_lists_one_line_naming_topics_apply(
    redis_service: str, unique: str, tmp_path: Path
) -> None:
    """A Redis key prefix no topic was made under: no empty table, the command that creates them."""
    topics = tmp_path / "decl"
    topics.mkdir()
    env = {
        **os.environ,
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": redis_service,
        "PIPELINE_REDIS__KEY_PREFIX": f"none{unique}",  # its keys go with the fixture
        "PIPELINE_TOPICS_DIR": str(topics),
    }
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "topics", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    line = (
        f"no topics on redis ({redis_service}, PIPELINE_REDIS__URL): `pipeline topics apply`"
        f" creates the ones declared in {topics}/"
    )
    assert result.stdout.splitlines() == [line]
    as_json = subprocess.run(
        [sys.executable, "-m", "pipeline", "topics", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert (as_json.returncode, as_json.stdout) == (0, "")  # one object per topic: none
