"""A `pipeline consume` member's /readyz and /healthz while it drains at shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx
from redis.asyncio import Redis
from runtime.helpers import declare, lane_spec
from support import delete_group_after

from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.testing.ports import free_port
from pipeline.transport import create_transport


async def _status(client: httpx.AsyncClient, url: str) -> int | None:
    """The status ``url`` answers, or None when nothing listens there."""
    try:
        return (await client.get(url)).status_code
    except httpx.TransportError:
        return None


async def test_a_draining_member_is_unready_but_alive_until_it_exits(
    settings: Settings, redis_service: str, redis: Redis, unique: str
) -> None:
    """After SIGTERM, while a handler still runs, /readyz answers 503 and /healthz 200."""
    transport = create_transport(settings, "redis")
    spec = lane_spec(f"probes_{unique}", 1)
    await declare(transport, spec)
    group, started = f"g-{unique}", f"started-{unique}"
    delete_group_after(transport, group, spec.topic_names())
    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"slow", b"a")])
    await producer.close()
    port = free_port()
    env = {
        **os.environ,
        "SLEEPY_TOPIC": spec.name,
        "SLEEPY_STARTED": started,
        "PIPELINE_REDIS__URL": redis_service,
        "PIPELINE_RUNTIME__METRICS_HOST": "127.0.0.1",
        "PIPELINE_RUNTIME__METRICS_PORT": str(port),
        "PIPELINE_RUNTIME__SHUTDOWN_GRACE_S": "3600",  # the drain lasts until the test ends it
        "PIPELINE_RUNTIME__CANCEL_GRACE_S": "0.2",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "pipeline", "consume", "runtime.sleepy_app:app", "--group", group),
        *("-t", "redis"),
        cwd=str(Path(__file__).parents[1]),
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            while not await redis.llen(started):
                assert proc.returncode is None, "the member ended before the handler started"
                await asyncio.sleep(0.05)
            while await _status(client, f"{base}/readyz") != 200:
                assert proc.returncode is None, "the member ended before it was ready"
                await asyncio.sleep(0.05)
            proc.send_signal(signal.SIGTERM)  # the drain: the handler holds it for an hour
            while (ready := await _status(client, f"{base}/readyz")) == 200:
                assert proc.returncode is None, "the member ended during its drain"
                await asyncio.sleep(0.05)
            alive = await _status(client, f"{base}/healthz")
            scraped = await _status(client, f"{base}/metrics")
        assert proc.returncode is None, "the member ended during its drain"
        proc.send_signal(signal.SIGINT)  # the second signal: stop now
        _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await transport.close()
    assert proc.returncode == 0, stderr.decode()
    assert (ready, alive, scraped) == (503, 200, 200)
