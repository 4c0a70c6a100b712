"""Crash and freeze loops: thousands of events on an ordered lane with retries, members hit."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest
from faults.cluster import Cluster
from faults.crashloop import APP, RETRY, CrashLoop, run_crashloop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ENV = {
    "PIPELINE_RUNTIME__MARK_PROCESSED": "false",  # no ingress: the events have no log rows
    "PIPELINE_RUNTIME__COMMIT_INTERVAL_MS": "500",  # the default, as deployed
    "PIPELINE_RUNTIME__LIVENESS_MS": "5000",  # the default, as deployed
    # The default: a killed member keeps its Kafka partitions this long (the suite's 3 s hid
    # the stale retry-tier copies of issue 13 on Kafka).
    "PIPELINE_KAFKA__SESSION_TIMEOUT_MS": "10000",
    "FAULTS_WORK_MS": "200",  # each run takes a downstream call's time, so runs can meet
}


async def test_crash_loop(make_cluster: Callable[..., Cluster]) -> None:
    """Members killed (-9) every 3-5 s under retries: nothing lost, reordered or overlapping.

    The two transports' clusters run at the same time (their handlers mostly wait on their
    downstream call), each with its own members, Redis names and kills; each is checked as if
    it ran alone.
    """
    await _on_both_transports(make_cluster, CrashLoop())


@pytest.mark.skipif(
    not os.environ.get("FAULTS_FREEZE_LOOP"),
    reason="opt-in: a run past every check whose process froze before its handler's first"
    " write is counted as an overlap (docs/faults.md, frozen members); set FAULTS_FREEZE_LOOP=1"
    " to run it",
)
async def test_frozen_members(make_cluster: Callable[..., Cluster]) -> None:
    """Members frozen (SIGSTOP) past their sessions and liveness, then resumed: taken for dead.

    While frozen, a member's partitions go to the others; resumed, it must start nothing of
    them beside their new owners (it confirms its claims first, finds them taken over and
    rejoins). Nothing lost or reordered; the only overlaps allowed are runs that were in their
    handler when their process froze.
    """
    loop = CrashLoop(events=3_000, produce_s=30.0, kills=0, freezes=2, freeze_s=12.0)
    await _on_both_transports(make_cluster, loop)


async def _on_both_transports(make_cluster: Callable[..., Cluster], loop: CrashLoop) -> None:
    """Run ``loop`` on a Redis and a Kafka cluster at once; each fails on its own."""
    clusters = [
        make_cluster(t, members=3, partitions=6, retry=RETRY, app=APP, env=ENV, name=f"_{t}")
        for t in ("redis", "kafka")
    ]
    results = await asyncio.gather(
        *(run_crashloop(c, loop) for c in clusters), return_exceptions=True
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    if len(failed) == 1:
        raise failed[0]
    assert not failed, "\n\n".join(f"{type(e).__name__}: {e}" for e in failed)
