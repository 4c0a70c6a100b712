"""`pipeline cancel` given a blank value, as ``--tenant "$TENANT"`` gives one when it is unset.

A blank ``--event``, ``--key`` or ``--tenant`` beside another target was dropped without a word,
so ``--key conv-42 --tenant ""`` cancelled the key for every tenant; alone it was answered "name
exactly one of ...", which the operator had done. A blank ``--reason`` was recorded, and the
command printed ``cancelled key k ()``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from redis import Redis
from support import test_settings


def cancel(*args: str, prefix: str) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline cancel ARGS`` against the shared Redis under the key prefix ``prefix``."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "cancel", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PIPELINE_REDIS__KEY_PREFIX": prefix},
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--event", ""], "--event ''"),
        (["--tenant", " "], "--tenant ' '"),
        (["--key", "conv-42", "--tenant", ""], "--tenant ''"),
        (["--event", "e-1", "--key", ""], "--key ''"),
        (["--key", "conv-42", "--reason", ""], "--reason ''"),
    ],
)
def test_a_blank_value_is_refused_and_nothing_cancelled(
    args: list[str], named: str, redis_service: str, unique: str
) -> None:
    """Exit 2, one line naming the option, and no cancellation written under the prefix."""
    del redis_service  # started (or the test skipped) by its fixture
    prefix = f"t{unique}"
    result = cancel(*args, prefix=prefix)
    assert result.returncode == 2, f"{result.returncode}: {result.stdout}{result.stderr}"
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {named}: "), line
    with Redis.from_url(test_settings().redis.url) as client:
        assert list(client.scan_iter(match=f"*{prefix}*")) == []
