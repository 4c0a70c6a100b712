"""A member killed after a key's second message parked it, before committing the first.

``m1`` (key ``k``) ran and succeeded; ``m2`` failed and parked ``k`` behind its retry copy; the
member is killed (SIGKILL) while that copy runs, before any commit (a long commit interval). The
next member reads ``m1`` again while ``k`` is still parked (``m2``'s copy waits until the main
partition's offsets are committed): it finished, so it must not run again, least of all after
``m2``'s success (held behind the head, it would run after it: ``m1, m2, m1``). Real
``pipeline consume`` processes (``runtime.parked_below_app``) on each transport.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from redis.asyncio import Redis
from runtime.helpers import declare, lane_spec, produce
from support import delete_group_after

from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.retry.keys import guard_keys
from pipeline.transport.protocol import Transport


async def _until(check: Callable[[], Awaitable[bool]], proc: asyncio.subprocess.Process) -> None:
    """Wait until ``check()`` holds (asked every 50 ms), within 90 s, while ``proc`` runs."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 90
    while not await check():
        assert proc.returncode is None, f"the member exited ({proc.returncode})"
        assert loop.time() < deadline, "not reached within 90 s"
        await asyncio.sleep(0.05)


async def test_a_finished_message_read_again_does_not_run_after_its_keys_head(
    transport: Transport, redis: Redis, unique: str, settings: Settings
) -> None:
    """``m1`` runs once, before ``m2``; ``m3`` (read after the crash) after ``m2``."""
    spec = lane_spec(f"below_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    group, runs = f"g-{unique}", f"below-runs-{unique}"
    delete_group_after(transport, group, spec.topic_names())  # its members are processes
    await produce(transport, spec.name, [Record(b"m1", b"k"), Record(b"m2", b"k")])
    env = {
        **os.environ,
        "BELOW_TOPIC": spec.name,
        "BELOW_RUNS": runs,
        "PIPELINE_KAFKA__SESSION_TIMEOUT_MS": "3000",
        "PIPELINE_REDIS__LEASE_MS": "1500",
        "PIPELINE_REDIS__HEARTBEAT_MS": "100",
    }

    def member(commit_interval_ms: int) -> Awaitable[asyncio.subprocess.Process]:
        """A member committing (and renewing its liveness) every ``commit_interval_ms``."""
        return asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pipeline",
            "consume",
            "runtime.parked_below_app:app",
            "--group",
            group,
            "-t",
            transport.name,
            cwd=str(Path(__file__).parents[1]),
            env={
                **env,
                "PIPELINE_RUNTIME__COMMIT_INTERVAL_MS": str(commit_interval_ms),
                "PIPELINE_RUNTIME__LIVENESS_MS": str(max(1500, 2 * commit_interval_ms)),
            },
        )

    async def ran() -> list[bytes]:
        return list(await redis.lrange(runs, 0, -1))

    async def hung() -> bool:
        return await redis.exists(f"{runs}:hung") == 1

    first = await member(600_000)  # nothing is committed before the kill
    try:
        await _until(hung, first)
    finally:
        if first.returncode is None:
            first.send_signal(signal.SIGKILL)
        await first.wait()
    assert await ran() == [b"m1:1:handled", b"m2:1:failed", b"m2:2:hung"]
    # Its liveness (twice its commit interval) runs out: moved on in Redis, not waited for.
    keys = guard_keys(settings.redis.key_prefix, spec.lane)  # its keys hold the lane's name
    await redis.delete(keys.live)

    await produce(transport, spec.name, [Record(b"m3", b"k")])
    second = await member(50)
    try:

        async def decided() -> bool:  # m1 and m2 read again, and decided while k is parked
            [lag] = await transport.admin().group_lag(group, spec.name)
            return lag.committed is not None and lag.committed >= 2

        await _until(decided, second)
        await redis.set(f"{runs}:go", 1)  # m2's copy may now succeed

        async def settled() -> bool:
            return b"m3:1:handled" in await ran() and await redis.hlen(keys.parked) == 0

        await _until(settled, second)
    finally:
        if second.returncode is None:
            second.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(second.wait(), 60) == 0
    handled = [run for run in await ran() if run.endswith(b":handled")]
    assert handled == [b"m1:1:handled", b"m2:2:handled", b"m3:1:handled"], await ran()
