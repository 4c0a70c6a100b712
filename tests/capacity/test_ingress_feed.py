"""The ingress counts what it produces per lane and exports the lane's desired members."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import httpx
import pytest
import yaml
from redis.asyncio import Redis
from support import delete_after_test
from support import test_settings as settings_for

from pipeline.capacity.feed import CapacityFeed
from pipeline.capacity.history import ArrivalHistory
from pipeline.capacity.settings import CapacitySettings
from pipeline.config import IngressSettings, SweeperSettings
from pipeline.errors import ConfigError, PipelineError
from pipeline.ingress.service import build_ingress
from pipeline.observability.metrics import Metrics
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport


async def test_produced_webhooks_land_in_the_lane_history(
    redis: Redis, unique: str, tmp_path: Path
) -> None:
    """Five accepted webhooks are five arrivals of their lane once the ingress stops."""
    spec = TopicSpec.model_validate({"name": f"cap_{unique}", "partitions": 2})
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "t.yaml").write_text(yaml.safe_dump({"name": spec.name, "partitions": 2}))
    sources = tmp_path / "sources.yaml"
    sources.write_text(
        yaml.safe_dump({"sources": {"plain": {"scheme": "none", "topic": spec.name}}})
    )
    settings = settings_for(
        topics_dir=topics, transport="redis", capacity=CapacitySettings(record=True)
    )
    ingress = IngressSettings(
        sources_file=sources,
        sqlite_path=tmp_path / "ingress.db",
        sweeper=SweeperSettings(enabled=False),
    )
    broker = create_transport(settings)
    delete_after_test(broker, spec.topic_names())
    await apply(broker.admin(), [spec], 1000, dry_run=False)
    built = build_ingress(settings, ingress)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=built.app), base_url="http://i")
    first_min = int(time.time() // 60)
    try:
        await built.start()
        for i in range(5):
            assert (await http.post("/hooks/plain", content=b'{"i": %d}' % i)).status_code == 200
        deadline = time.monotonic() + 30
        while built.dispatcher is None or built.dispatcher.counters.produced < 5:
            assert time.monotonic() < deadline, "the webhooks were not produced in 30 s"
            await asyncio.sleep(0.02)
        assert await built.observer.refresh_once()
        registry = built.observer.metrics.registry
        assert registry.get_sample_value("pipeline_desired_members", {"lane": spec.lane}) == 1
    finally:
        await built.stop()
        await http.aclose()
        for topic in spec.topic_names():
            with contextlib.suppress(PipelineError):
                await broker.admin().delete_topic(topic)
        await broker.close()
    last_min = int(time.time() // 60)
    history = ArrivalHistory(redis, settings.redis.key_prefix)
    try:
        (window,) = await history.windows(spec.lane, [(first_min, last_min + 1)])
        assert window is not None
        assert sum(window) == 5
    finally:
        pattern = f"{{{settings.redis.key_prefix}:cap:{spec.lane}}}*"
        found = [key async for key in redis.scan_iter(match=pattern)]
        if found:
            await redis.delete(*found)


async def test_the_ingress_refuses_a_service_time_for_a_lane_no_topic_declares() -> None:
    """The plan the ingress exports would size a misspelt lane with the default service time."""
    spec = TopicSpec.model_validate({"name": "messages", "partitions": 2})
    settings = settings_for(capacity=CapacitySettings(record=True, service_s={"mesages": 4.0}))
    feed = CapacityFeed(settings, [spec])
    try:
        with pytest.raises(ConfigError, match=r"PIPELINE_CAPACITY__SERVICE_S .*'mesages'"):
            feed.source(Metrics())
    finally:
        await feed.close()
