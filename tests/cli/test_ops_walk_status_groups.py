"""`pipeline status` given an empty or a repeated group, as an operator types one.

``-g ''`` (an unset variable in a script: ``-g "$GROUP"``) reached librdkafka as an empty
``group.id`` on Kafka, whose assertion aborted the process (exit 134, a C assertion on stderr);
on Redis it printed a row for a group named ``''``. An empty group in
``PIPELINE_INGRESS__SWEEPER__LANE_GROUPS`` did the same. ``-g G -g G`` printed every lane twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from lane_support import lane_spec
from support import delete_after_test
from support import test_settings as settings_for
from test_status import write_spec
from test_status_missing_topics_exit import declare

from pipeline.cli.status_view import gather
from pipeline.topics.admin import apply


def status(*args: str, topics: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline status --no-log ARGS`` over the topics directory ``topics``."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "status", "--no-log", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PIPELINE_TOPICS_DIR": str(topics), **env},
        check=False,
    )


@pytest.mark.parametrize("group", ["", " "])
async def test_an_empty_group_is_refused_in_one_line(transport, group, tmp_path, unique):
    """Exit 2 with one line naming --group, on a lane whose topics exist (Kafka aborted)."""
    spec = lane_spec(f"walk-{unique}")
    delete_after_test(transport, spec.topic_names())
    await apply(transport.admin(), [spec], 100_000, dry_run=False)
    topics = write_spec(tmp_path / "topics", spec)
    result = status("-t", transport.name, "-g", group, topics=topics)
    assert result.returncode == 2, f"{result.returncode}: {result.stdout}{result.stderr}"
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: --group {group!r}: a consumer group needs a name"), line


@pytest.mark.parametrize("transport", ["redis", "kafka"])
def test_an_empty_group_in_lane_groups_is_refused_in_one_line(
    transport: str, request: pytest.FixtureRequest, tmp_path: Path, unique: str
) -> None:
    """The setting's empty group: exit 2, one line naming the variable and the lane."""
    request.getfixturevalue(f"{transport}_service")
    lane = f"walk_{unique}"
    topics = declare(tmp_path / "topics", lane)
    groups = f'{{"{lane}": ""}}'
    result = status("-t", transport, topics=topics, PIPELINE_INGRESS__SWEEPER__LANE_GROUPS=groups)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: PIPELINE_INGRESS__SWEEPER__LANE_GROUPS"), line
    assert repr(lane) in line, line


async def test_a_repeated_group_is_read_once(transport, unique, tmp_path):
    """``-g G -g G``: one row per lane, as ``-g G``."""
    lane = f"walk_{unique}"
    settings = settings_for(topics_dir=declare(tmp_path / "topics", lane), transport=transport.name)
    report = await gather(settings, [f"g-{unique}", f"g-{unique}"], with_log=False)
    assert [(s.report.lane, s.report.group) for s in report.lanes] == [(lane, f"g-{unique}")]
