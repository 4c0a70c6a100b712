"""A member with capacity recording on records its lanes' service time, metrics port or not."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from redis.asyncio import Redis
from runtime.helpers import declare, lane_spec
from support import delete_group_after

from pipeline.capacity.history import ArrivalHistory
from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.transport.protocol import Transport


async def reaches(read: Callable[[], Awaitable[int]], want: int, timeout_s: float) -> None:
    """Wait until ``read()`` gives ``want`` (asked every 50 ms); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (got := await read()) != want:
        assert time.monotonic() < deadline, f"{got} after {timeout_s} s, not {want}"
        await asyncio.sleep(0.05)


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
    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"m%d" % n, b"k%d" % n) for n in range(3)])
    await producer.close()
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "pipeline", "consume", "runtime.poison_app:app"),
        *("--group", group, "-t", transport.name),
        cwd=str(Path(__file__).parents[1]),
        env=env,
        stderr=asyncio.subprocess.DEVNULL,
    )
    history = ArrivalHistory(redis, settings.redis.key_prefix)  # its key holds the lane's name

    async def handled() -> int:
        return int(await redis.scard(done))

    async def served() -> int:
        return (await history.service(spec.lane, int(time.time() // 60) + 1)).count

    try:
        await reaches(handled, 3, 60)
        await reaches(served, 3, 30)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
