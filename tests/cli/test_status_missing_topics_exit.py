"""`pipeline status` with declared topics missing on the broker exits non-zero (1), not 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.cli.status import LaneStatus, Status
from pipeline.observability.lanes import LaneReport


def declare(directory: Path, name: str) -> Path:
    """A topics directory declaring lane ``name`` (one retry tier), never applied."""
    directory.mkdir(parents=True, exist_ok=True)
    document = {"name": name, "partitions": 2, "lane": name, "retry": {"tiers": ["5s"]}}
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(document), encoding="utf-8")
    return directory


def status(*args: str, topics: Path) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline status ARGS --no-log`` over the topics directory ``topics``."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "status", "--no-log", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PIPELINE_TOPICS_DIR": str(topics)},
        check=False,
    )


@pytest.mark.parametrize("transport", ["redis", "kafka"])
def test_status_with_every_topic_missing_exits_1(
    transport: str, request: pytest.FixtureRequest, tmp_path: Path, unique: str
) -> None:
    """Lag 0 on a lane whose topics do not exist is no figure: the report lists them, exits 1."""
    request.getfixturevalue(f"{transport}_service")
    name = f"missing_{unique}"
    topics = declare(tmp_path / "topics", name)
    result = status("-t", transport, topics=topics)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [ln for ln in result.stdout.splitlines() if ln.startswith("missing topics")]
    assert f"{name}, {name}.dlq, {name}.retry.5s" in line
    as_json = status("-t", transport, "--json", topics=topics)
    assert as_json.returncode == 1, as_json.stdout + as_json.stderr
    (lane,) = json.loads(as_json.stdout)["lanes"]
    assert sorted(lane["missing_topics"]) == [name, f"{name}.dlq", f"{name}.retry.5s"]


def report(missing: tuple[str, ...] = ()) -> LaneReport:
    """A lane report with nothing waiting, and ``missing`` topics."""
    return LaneReport("messages", "messages", 0, 0.0, {}, 0, missing_topics=missing)


def test_a_report_with_a_missing_topic_is_not_healthy() -> None:
    """One missing topic of one lane makes the status unhealthy; none missing keeps it healthy."""
    assert Status("redis", (LaneStatus(report()),)).healthy
    missing = Status("redis", (LaneStatus(report()), LaneStatus(report(("messages.dlq",)))))
    assert not missing.healthy
