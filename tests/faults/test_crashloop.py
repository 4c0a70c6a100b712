"""The crash-loop scenario: thousands of events on an ordered lane with retries, members killed."""

from __future__ import annotations

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


@pytest.mark.parametrize("transport", ["redis", "kafka"])
async def test_crash_loop(make_cluster: Callable[..., Cluster], transport: str) -> None:
    """Members killed (-9) every 3-5 s under retries: nothing lost, reordered or overlapping."""
    cluster = make_cluster(transport, members=3, partitions=6, retry=RETRY, app=APP, env=ENV)
    await run_crashloop(cluster, CrashLoop())
