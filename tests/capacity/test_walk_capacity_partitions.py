"""`pipeline capacity LANE` holds the members it asks for to the lane's partitions.

docs/operations.md, "Sizing a lane", step 3: *members needed* is what `pipeline_desired_members`
asks KEDA for, and when it exceeds the lane's partitions they must be added first (members
beyond the partition count sit idle; the ScaledObject's `maxReplicaCount` is that count). The
command read the declarations and never said so: a lane of 12 partitions that needed 24
members was printed "members needed 24" beside nothing to compare it with.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis
from support import run_pipeline

from pipeline.capacity.history import ArrivalHistory

ROOT = Path(__file__).parents[2]


async def busy_minutes(redis: Redis, prefix: str, lane: str, per_s: int) -> None:
    """``per_s`` arrivals a second in every minute of the last half hour and the next one."""
    now = int(time.time() // 60)
    counts = {(lane, minute): per_s * 60 for minute in range(now - 30, now + 2)}
    await ArrivalHistory(redis, prefix).add_once("walk", [(1, counts)], settled={})


def capacity(prefix: str, service_s: float, *args: str) -> str:
    """`pipeline capacity ai_turns ARGS` against the repository's topics; its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env |= {
        "PIPELINE_REDIS__KEY_PREFIX": prefix,
        "PIPELINE_TOPICS_DIR": str(ROOT / "topics"),
        "PIPELINE_CAPACITY__SERVICE_S": json.dumps({"ai_turns": service_s}),
    }
    result = run_pipeline("capacity", "ai_turns", *args, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.usefixtures("redis_service")
async def test_members_beyond_the_partitions_are_named_with_the_partitions_to_add(
    redis: Redis, prefix: str
) -> None:
    """300/s of 3.5 s each need 24 members of 64 slots; ai_turns has 12 partitions."""
    await busy_minutes(redis, prefix, "ai_turns", 300)
    shown = json.loads(capacity(prefix, 3.5, "--json"))
    assert (shown["desired_members"], shown["partitions"]) == (24, 12)
    text = capacity(prefix, 3.5)
    assert "  partitions      12 (at most 12 members consume)" in text
    assert (
        "members needed  24 at 70% utilisation, 17 for a 1 s mean wait: more than the lane's 12"
        " partitions, add partitions (topics/*.yaml, pipeline topics apply) first" in text
    )


@pytest.mark.usefixtures("redis_service")
async def test_members_within_the_partitions_add_no_warning(redis: Redis, prefix: str) -> None:
    """The same arrivals at 0.35 s need 3 members: the partitions line only."""
    await busy_minutes(redis, prefix, "ai_turns", 300)
    text = capacity(prefix, 0.35)
    assert "  partitions      12 (at most 12 members consume)" in text
    assert "members needed  3 at 70% utilisation, 2 for a 1 s mean wait\n" in text
    assert "add partitions" not in text
