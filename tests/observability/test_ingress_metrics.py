"""The running ingress serves its counters, log-store ages and sweeper heartbeat at /metrics."""

from __future__ import annotations

import asyncio
import time

import httpx
from ingress.helpers import one_lane_ingress
from lane_support import drop, lane_spec
from redis.asyncio import Redis
from support import delete_after_test

from pipeline.admission.debounce import Debouncer
from pipeline.config import SweeperSettings
from pipeline.envelope import Message
from pipeline.ingress.service import build_ingress
from pipeline.topics.admin import apply
from pipeline.topics.spec import DebouncePolicy
from pipeline.transport import create_transport


async def test_ingress_metrics_show_requests_and_the_sweeper_heartbeat(
    redis_service, unique, tmp_path
):
    """After one webhook and the first sweep, /metrics shows both and /readyz follows start/stop."""
    spec = lane_spec(f"obs-ingress-{unique}")
    settings, ingress = one_lane_ingress(
        tmp_path,
        {"name": spec.name, "partitions": 2, "lane": spec.lane},
        {"plain": {"scheme": "none", "topic": spec.name}},
        sweeper=SweeperSettings(interval_s=3600),
    )
    broker = create_transport(settings)
    delete_after_test(broker, spec.topic_names())
    await apply(broker.admin(), [spec], 1000, dry_run=False)
    built = build_ingress(settings, ingress)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=built.app), base_url="http://i")
    try:
        await built.start()
        assert (await http.get("/readyz")).status_code == 200
        assert (await http.post("/hooks/plain", content=b'{"a": 1}')).status_code == 200
        deadline = time.monotonic() + 30
        stamp = "pipeline_sweeper_last_run_timestamp_seconds"
        while not built.observer.metrics.registry.get_sample_value(stamp):
            assert time.monotonic() < deadline, "the first sweep did not finish in 30 s"
            await asyncio.sleep(0.02)
        assert await built.observer.refresh_once()
        text = (await http.get("/metrics")).text
        assert 'outcome="accepted",reason="",source="plain"} 1.0' in text
        assert "pipeline_log_abandoned_rows 0.0" in text
        assert "pipeline_log_commit_rows_count 1.0" in text  # the one webhook's row, committed
        assert "pipeline_log_commit_duration_seconds_count 1.0" in text
        assert f'pipeline_consumer_lag_messages{{group="{spec.lane}",lane="{spec.lane}"}}' in text
    finally:
        await built.stop()
        assert (await http.get("/readyz")).status_code == 503
        await http.aclose()
        await drop(broker, spec)
        await broker.close()


async def test_ingress_metrics_show_how_long_a_debounced_turn_has_been_due(
    redis_service, unique, tmp_path
):
    """A turn recorded in a debounced lane, with no member running it, is in the ingress's gauge."""
    lane = f"obs_deb_{unique}"
    declared = {"name": lane, "partitions": 1, "debounce": {"key": "c", "quiet_s": 4}}
    sources = {"plain": {"scheme": "none", "topic": lane}}
    settings, ingress = one_lane_ingress(tmp_path, declared, sources)
    policy = DebouncePolicy(key="c", quiet_s=4, max_batch=1)  # one message: due at once
    client = Redis.from_url(settings.redis.url)
    debouncer = Debouncer(client, settings.redis.key_prefix, lane, policy)
    built = build_ingress(settings, ingress)
    try:
        await debouncer.record("c1", Message(lane, 0, 1, b"c1", b"{}", {}, 1_000))
        await built.start()
        assert await built.observer.refresh_once()
        overdue = "pipeline_debounce_overdue_seconds"
        value = built.observer.metrics.registry.get_sample_value(overdue, {"lane": lane})
        assert value is not None
        assert value >= 0
    finally:
        await built.stop()
        await client.aclose()
