"""Helpers for the offload tests: an offloading lane on a real broker, a port nothing serves."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from ingress.helpers import ingress_env
from redis.asyncio import Redis
from runtime.helpers import declare, lane_spec
from support import IDLE_APP, run_pipeline

from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport


def offload_lane(name: str, store_url: str | None, **fields: Any) -> TopicSpec:
    """A lane with one 200 ms retry tier, two attempts, and (with a store) ``offload:``."""
    extra = {"offload": {"above": "256KiB", "store": store_url}} if store_url else {}
    return lane_spec(name, 2, retry={"tiers": ["200ms"], "max_attempts": 2}, **extra, **fields)


@asynccontextmanager
async def declared(
    transport: Transport, redis: Redis, prefix: str, *specs: TopicSpec
) -> AsyncIterator[None]:
    """Declare ``specs`` on the broker; delete their topics and the ``prefix`` Redis keys after."""
    await declare(transport, *specs)
    try:
        yield
    finally:
        admin = transport.admin()
        for spec in specs:
            for topic in spec.topic_names():
                await admin.delete_topic(topic)
        keys = [key async for key in redis.scan_iter(match=f"*{prefix}*")]
        if keys:
            await redis.delete(*keys)


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def offload_env(tmp_path: Path, lane: str, store: str, **extra: str) -> dict[str, str]:
    """A lane ``lane`` offloading to ``store`` on S3Proxy, an ingress with no sources, Redis down.

    Files in ``tmp_path``; none of the caller's ``PIPELINE_`` or ``AWS_`` variables, so no
    credentials unless ``extra`` (more variables) gives them.
    """
    topics = tmp_path / "topics"
    topics.mkdir(exist_ok=True)
    (topics / f"{lane}.yaml").write_text(
        f"name: {lane}\npartitions: 1\noffload:\n  store: {store}\n", encoding="utf-8"
    )
    (tmp_path / "sources.yaml").write_text("sources: {}\n", encoding="utf-8")
    redis_down = f"redis://127.0.0.1:{closed_port()}/0"
    env = ingress_env(tmp_path, redis_down, topics)
    return {k: v for k, v in env.items() if not k.startswith("AWS_")} | {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "PIPELINE_MEMBERSHIP__SLOT_DIR": str(tmp_path / "slots"),
        **extra,
    }


def consume_idle(
    tmp_path: Path, lane: str, group: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``pipeline consume`` of an app doing nothing with ``lane``, in ``group``, run to its end."""
    (tmp_path / f"{lane}.py").write_text(IDLE_APP.format(lane=lane), encoding="utf-8")
    return run_pipeline("consume", f"{lane}:app", "-g", group, env=env, cwd=tmp_path)
