"""`pipeline status` with a service down: one line naming the address and variable, exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import load_settings
from pipeline.reachability import unreachable

DOWN_REDIS = "redis://127.0.0.1:1/0"
DOWN_KAFKA = "127.0.0.1:1"


def status(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline status ARGS`` in a subprocess with ``env`` added to the environment."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "status", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        check=False,
    )


@pytest.mark.parametrize(
    ("transport", "env", "address", "variable"),
    [
        ("redis", {"PIPELINE_REDIS__URL": DOWN_REDIS}, DOWN_REDIS, "PIPELINE_REDIS__URL"),
        (
            "kafka",
            {"PIPELINE_KAFKA__BOOTSTRAP_SERVERS": DOWN_KAFKA},
            DOWN_KAFKA,
            "PIPELINE_KAFKA__BOOTSTRAP_SERVERS",
        ),
    ],
)
def test_broker_down_is_one_line_and_exit_1(
    transport: str, env: dict[str, str], address: str, variable: str
) -> None:
    """With the transport's broker down, status prints one error line naming it and exits 1."""
    result = status("-t", transport, env=env)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert address in lines[0]
    assert variable in lines[0]
    assert "make services" in lines[0]
    assert result.stdout == ""


def test_redis_down_on_kafka_leaves_out_the_throttles(kafka_service: str) -> None:
    """On Kafka with Redis down, status still shows the lanes, says why throttles are missing."""
    result = status("-t", "kafka", "--no-log", env={"PIPELINE_REDIS__URL": DOWN_REDIS})
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert "messages" in result.stdout
    (line,) = [ln for ln in result.stdout.splitlines() if ln.startswith("throttled tenants")]
    assert DOWN_REDIS in line
    assert "PIPELINE_REDIS__URL" in line


def test_password_is_not_printed() -> None:
    """The Redis address in the message hides the URL's password."""
    settings = load_settings(redis={"url": "redis://app:s3cret@10.0.0.5:6380/2"})
    line = unreachable(settings, "redis", "timed out")
    assert "s3cret" not in line
    assert "redis://app:***@10.0.0.5:6380/2" in line


def test_redis_down_on_kafka_without_throttled_lanes_is_a_partial_report(
    kafka_service: str, tmp_path: Path, unique: str
) -> None:
    """The cancelled and hung counts it cannot read say where Redis is, and status exits 1."""
    lane = f"plain_{unique}"
    (tmp_path / f"{lane}.yaml").write_text(f"name: {lane}\npartitions: 1\n")
    env = {"PIPELINE_REDIS__URL": DOWN_REDIS, "PIPELINE_TOPICS_DIR": str(tmp_path)}
    result = status("-t", "kafka", "--no-log", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    (line,) = [ln for ln in result.stdout.splitlines() if ln.startswith("cancelled / hung")]
    assert DOWN_REDIS in line
    assert "PIPELINE_REDIS__URL" in line
    document = status("-t", "kafka", "--no-log", "--json", env=env)
    assert document.returncode == 1
    assert DOWN_REDIS in json.loads(document.stdout)["cancellations_error"]
