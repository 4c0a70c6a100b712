"""`pipeline topics list` against a real broker: what it shows of each topic."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support import delete_after_test, test_settings

from pipeline.transport import create_transport
from pipeline.transport.protocol import TopicConfig


def _pipeline(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline ARGS`` and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )


async def test_topics_list_shows_the_max_len_of_a_redis_topic(
    redis_service: str, unique: str
) -> None:
    """A Redis topic's retention by length (max_len) is shown in the table and in --json."""
    del redis_service
    topic = f"maxlen_{unique}"
    transport = create_transport(test_settings(), "redis")
    try:
        delete_after_test(transport, [topic])
        await transport.admin().create_topic(TopicConfig(topic, 2, max_len=4321))
    finally:
        await transport.close()
    listed = _pipeline("topics", "list", "--json", "-t", "redis")
    assert listed.returncode == 0, listed.stderr
    rows = {row["topic"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert rows[topic]["max_len"] == 4321
    table = _pipeline("topics", "list", "-t", "redis")
    assert table.returncode == 0, table.stderr
    line = next(line for line in table.stdout.splitlines() if topic in line)
    assert "4321" in line
