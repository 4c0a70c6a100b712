"""``pipeline tail`` of a topic that does not exist says so in the same line on both transports.

On Redis it said ``topic 'x' does not exist (...)``; on Kafka the reader's metadata error came
through as ``consume ['x']: Broker: Unknown topic or partition (...)``, librdkafka's words and a
Python list. Both now name the topic, the transport, and ``pipeline topics list``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import ROOT, cli_environment, run_pipeline


@pytest.mark.parametrize("transport", ["kafka", "redis"])
@pytest.mark.parametrize("first", [(), ("--from-beginning", "-n", "3")])
def test_tail_of_a_topic_that_does_not_exist(
    transport: str,
    first: tuple[str, ...],
    tmp_path: Path,
    unique: str,
    request: pytest.FixtureRequest,
) -> None:
    """Exit 1 with one line naming the topic and the listing; nothing is created."""
    request.getfixturevalue(f"{transport}_service")
    topic = f"w2tail_{unique}"
    result = run_pipeline(
        "tail", topic, "-t", transport, *first, env=cli_environment(tmp_path), timeout_s=60
    )
    assert result.returncode == 1, f"{result.returncode}: {result.stdout}{result.stderr}"
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line == (
        f"error: topic '{topic}' does not exist on {transport}: `pipeline topics list` shows"
        f" the topics there (declare it in {ROOT / 'topics'}/ and run `pipeline topics apply`)"
    ), line
    listed = run_pipeline("topics", "list", "-t", transport, env=cli_environment(tmp_path))
    assert topic not in listed.stdout, listed.stdout
