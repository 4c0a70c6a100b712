"""The crash-loop scenario: thousands of events on an ordered lane with retries, members killed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from faults.cluster import Cluster
from faults.crashloop import APP, RETRY, CrashLoop, run_crashloop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.mark.parametrize("transport", ["redis", "kafka"])
async def test_crash_loop(make_cluster: Callable[..., Cluster], transport: str) -> None:
    """Members killed (-9) every 3-5 s under retries: nothing lost, reordered or overlapping."""
    cluster = make_cluster(
        transport,
        members=3,
        partitions=6,
        retry=RETRY,
        app=APP,
        env={"PIPELINE_RUNTIME__MARK_PROCESSED": "false", "FAULTS_WORK_MS": "200"},
    )
    await run_crashloop(cluster, CrashLoop())
