"""A member with capacity recording on records its lanes' service time, metrics port or not."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from contract.helpers import wait_for
from redis.asyncio import Redis
from runtime.helpers import declare, lane_spec, produce
from support import delete_group_after

from pipeline.capacity.history import ArrivalHistory
from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.transport.protocol import Transport


async def test_a_member_without_a_metrics_port_records_service_times(
    transport: Transport, redis: Redis, settings: Settings, unique: str
) -> None:
    """``pipeline consume`` with ``CAPACITY__RECORD`` and no metrics port: the samples arrive.

    The service time is read from the member's registry when its metrics sources refresh; with
    no ``/metrics`` endpoint nothing refreshed them and no sample was ever written.
    """
    spec = lane_spec(f"svc_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    group = f"g-{unique}"
    delete_group_after(transport, group, spec.topic_names())
    done = f"done-{unique}"
    env = {
        key: value for key, value in os.environ.items() if key != "PIPELINE_RUNTIME__METRICS_PORT"
    }
    env |= {
        "POISON_TOPIC": spec.name,
        "POISON_DONE": done,
        "PIPELINE_CAPACITY__RECORD": "true",
        "PIPELINE_RUNTIME__METRICS_INTERVAL_S": "0.2",
    }
    await produce(transport, spec.name, [Record(b"m%d" % n, b"k%d" % n) for n in range(3)])
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "pipeline", "consume", "runtime.poison_app:app"),
        *("--group", group, "-t", transport.name),
        cwd=str(Path(__file__).parents[1]),
        env=env,
        stderr=asyncio.subprocess.DEVNULL,
    )
    history = ArrivalHistory(redis, settings.redis.key_prefix)  # its key holds the lane's name

    async def handled() -> bool:
        return int(await redis.scard(done)) == 3

    async def served() -> bool:
        return (await history.service(spec.lane, int(time.time() // 60) + 1)).count == 3

    try:
        await wait_for(handled, 60)
        await wait_for(served, 30)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
