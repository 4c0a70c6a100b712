"""A cpu=True handler's worker, and what it started, do not outlive their member.

The workers are children of multiprocessing's forkserver, not of the member, and each holds
the forkserver alive; a worker busy in a handler that never returns used to run on, with its
children, after its member was killed (kill -9, the OOM killer), burning a CPU for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from runtime.helpers import alive, consume_process, eventually, lane_spec

from pipeline.envelope import Record
from pipeline.transport.protocol import Transport


@pytest.fixture
async def spinning(
    transport: Transport, redis: Redis, unique: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, list[int]]]:
    """`pipeline consume` running spinning_app's handler, and its worker's and child's pids."""
    spec = lane_spec(f"spinning_{unique}", 1, ordered=False)
    group, started = f"g-{unique}", f"spinning-started-{unique}"
    env = {
        **os.environ,
        "SPINNING_TOPIC": spec.name,
        "SPINNING_STARTED": started,
        "PIPELINE_RUNTIME__SHUTDOWN_GRACE_S": "0.2",
        "PIPELINE_RUNTIME__CANCEL_GRACE_S": "0.2",
    }
    proc = await consume_process(
        transport,
        spec,
        "runtime.spinning_app:app",
        group,
        Record(b"spin", b"a"),
        env,
        asyncio.subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:
        while not (got := await redis.lindex(started, 0)):
            assert proc.returncode is None, "the member ended before the handler started"
            await asyncio.sleep(0.05)
        pids = [int(pid) for pid in got.decode().split(":")]
        yield proc, pids
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for pid in pids:  # whatever the test found, leave no spinning process behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await redis.delete(started)


async def test_a_busy_worker_and_its_children_die_with_a_killed_member(
    spinning: tuple[asyncio.subprocess.Process, list[int]],
) -> None:
    """The member killed (kill -9): its worker, busy in the handler, and the child go too."""
    proc, (worker, child) = spinning
    assert alive(worker)
    assert alive(child)
    proc.kill()
    await proc.wait()
    await eventually(lambda: not alive(worker) and not alive(child), timeout_s=30)


async def test_a_busy_worker_and_its_children_are_stopped_when_the_member_is_stopped(
    spinning: tuple[asyncio.subprocess.Process, list[int]],
) -> None:
    """SIGTERM: the run is cancelled, the worker deaf to it is killed after the grace."""
    proc, (worker, child) = spinning
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    await eventually(lambda: not alive(worker) and not alive(child), timeout_s=30)
