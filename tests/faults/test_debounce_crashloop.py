"""The crash loop on a debounced lane: conversations in bursts while members are killed (-9)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from faults.crashloop import CrashLoop
from faults.debounce_crashloop import (
    APP,
    RETRY,
    Bursts,
    DebounceCluster,
    burst_messages,
    run_debounce_crashloop,
)
from faults.services import PrivateRedis

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ENV = {
    "PIPELINE_RUNTIME__MARK_PROCESSED": "false",  # no ingress: the messages have no log rows
    "PIPELINE_RUNTIME__COMMIT_INTERVAL_MS": "500",  # the default, as deployed
    "PIPELINE_RUNTIME__LIVENESS_MS": "5000",  # the default, as deployed
    "PIPELINE_KAFKA__SESSION_TIMEOUT_MS": "10000",  # the default, as deployed
    "FAULTS_WORK_MS": "200",  # each turn takes a model call's time, so kills catch turns running
    "FAULTS_FLAKY_PER_MILLE": "20",
}
# 12 kills, one every 3-5 s; a killed member's turns wait out the debouncer's 30 s lease.
LOOP = CrashLoop(kills=12, kill_every_s=(3.0, 5.0), seed=31, deadline_s=150.0)


def test_bursts_shape() -> None:
    """~3,000 messages over 200 conversations, each in record order, bursts split by quiet."""
    messages = burst_messages(Bursts(), LOOP.seed)
    assert len(messages) == 3_000
    assert len({m.conv for m in messages}) == 200
    by_conv: dict[str, list[int]] = {}
    for m in messages:
        by_conv.setdefault(m.conv, []).append(m.n)
    assert all(ns == sorted(ns) for ns in by_conv.values())


@pytest.mark.skipif(
    not os.environ.get("FAULTS_DEBOUNCE_LOOP"),
    reason="opt-in (about 2 minutes): set FAULTS_DEBOUNCE_LOOP=1 or run `make faults-debounce`",
)
async def test_debounce_crash_loop(
    request: pytest.FixtureRequest, tmp_path: Path, private_redis: PrivateRedis, unique: str
) -> None:
    """Members killed (-9) every 3-5 s under bursts: nothing lost, reordered or overlapping.

    Both transports' clusters run at the same time, each with its own members, names and kills;
    each is checked as if it ran alone.
    """
    clusters = []
    for transport in ("redis", "kafka"):
        bootstrap = None
        if transport == "kafka":
            bootstrap = request.getfixturevalue("private_kafka").bootstrap_servers
        clusters.append(
            DebounceCluster(
                tmp_path / f"cluster_{transport}",
                transport,
                f"{unique}_{transport}",
                redis_url=private_redis.url,
                bootstrap_servers=bootstrap,
                members=3,
                partitions=6,
                retry=RETRY,
                app=APP,
                env=ENV,
            )
        )
    results = await asyncio.gather(
        *(run_debounce_crashloop(c, Bursts(), LOOP) for c in clusters), return_exceptions=True
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    if len(failed) == 1:
        raise failed[0]
    assert not failed, "\n\n".join(f"{type(e).__name__}: {e}" for e in failed)
