"""Helpers for the offload tests: an offloading lane on a real broker, a port nothing serves."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import obstore
import pytest
from ingress.helpers import ingress_env
from obstore.store import S3Store
from redis.asyncio import Redis
from runtime.helpers import declare, lane_spec
from support import IDLE_APP, require_service, run_pipeline

from pipeline.offload.store import open_store
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport

# What deploy/local/s3proxy.sh configures; the environment wins when it names another service.
S3PROXY = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_ACCESS_KEY_ID": "pipeline",
    "AWS_SECRET_ACCESS_KEY": "pipeline-local-secret",
}


@asynccontextmanager
async def s3_prefix(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """A fresh store URL, a uuid prefix in S3Proxy's bucket, emptied when the block ends."""
    for name, value in S3PROXY.items():
        if not os.environ.get(name):
            monkeypatch.setenv(name, value)
    endpoint = urlparse(os.environ["AWS_ENDPOINT_URL"])
    require_service("s3proxy", endpoint.hostname or "127.0.0.1", endpoint.port or 9000)
    url = f"s3://pipeline/test-{uuid.uuid4().hex[:10]}"
    yield url
    store = open_store(url)
    for key in [obj.key async for obj in store.list()]:
        await store.delete(key)
    # S3Proxy's filesystem backend keeps the emptied directories; they list as ETag-less objects.
    raw = S3Store.from_url(url, client_options={"allow_http": True}, region="us-east-1")
    markers = [m["path"] for page in obstore.list(raw) for m in page]
    for key in sorted(markers, key=len, reverse=True):
        await store.delete(key)
    await store.delete("")  # the prefix itself


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
