"""The alarm signal: oldest-message age and lag per lane and group, from a real broker."""

from __future__ import annotations

import pytest
from contract.helpers import expire_below
from lane_support import drop, lane_spec, partly_consumed

from pipeline.envelope import TopicPartition
from pipeline.observability.facades import LagMetrics
from pipeline.observability.lanes import lane_watches
from pipeline.observability.metrics import Metrics
from pipeline.observability.sources import GroupLagSource


async def test_age_gauge_reads_the_oldest_uncommitted_message(transport, unique):
    """Committing 3 of 6 shows lag 3 and the 4th message's age; committing all shows zeros."""
    spec = lane_spec(f"obs-lag-{unique}")
    group = f"g-{unique}"
    labels = {"lane": spec.lane, "group": group}
    try:
        async with partly_consumed(transport, spec, group, produced=6, committed=3) as lane:
            oldest_ms = lane.messages[3].timestamp_ms
            metrics = Metrics()
            value = metrics.registry.get_sample_value
            source = GroupLagSource(
                transport.admin(),
                lane_watches([spec], only_groups=[group]),
                LagMetrics(metrics),
                clock=lambda: (oldest_ms + 42_000) / 1000,
            )
            await source.refresh()
            assert value("pipeline_consumer_lag_messages", labels) == 3
            assert value("pipeline_oldest_message_age_seconds", labels) == pytest.approx(42.0)
            assert value("pipeline_retry_tier_messages", {**labels, "tier": "5s"}) == 1
            assert value("pipeline_dead_letter_messages", {"lane": spec.lane}) == 1
            assert source.reports[0].missing_topics == ()

            await lane.commit(6)
            await source.refresh()
            assert value("pipeline_consumer_lag_messages", labels) == 0
            assert value("pipeline_oldest_message_age_seconds", labels) == 0
    finally:
        await drop(transport, spec)


async def test_missing_topics_are_reported_not_raised(transport, unique):
    """A lane declared but never applied reads as missing topics instead of failing the refresh."""
    spec = lane_spec(f"obs-missing-{unique}")
    source = GroupLagSource(
        transport.admin(), lane_watches([spec], only_groups=["g"]), LagMetrics(Metrics())
    )
    await source.refresh()
    assert set(source.reports[0].missing_topics) == set(spec.topic_names())


async def test_expired_messages_are_not_counted_as_lag(transport, settings, unique):
    """A group behind retention lags by the messages still held, aged by the first of them."""
    spec = lane_spec(f"obs-expired-{unique}")
    group = f"g-{unique}"
    labels = {"lane": spec.lane, "group": group}
    try:
        async with partly_consumed(transport, spec, group, produced=6, committed=1) as lane:
            await expire_below(transport, settings, TopicPartition(spec.name, 0), 4)
            oldest_ms = lane.messages[4].timestamp_ms
            metrics = Metrics()
            source = GroupLagSource(
                transport.admin(),
                lane_watches([spec], only_groups=[group]),
                LagMetrics(metrics),
                clock=lambda: (oldest_ms + 7_000) / 1000,
            )
            await source.refresh()
            value = metrics.registry.get_sample_value
            assert value("pipeline_consumer_lag_messages", labels) == 2
            assert value("pipeline_oldest_message_age_seconds", labels) == pytest.approx(7.0)

            await expire_below(transport, settings, TopicPartition(spec.name, 0), 6)
            await source.refresh()
            assert value("pipeline_consumer_lag_messages", labels) == 0
            assert value("pipeline_oldest_message_age_seconds", labels) == 0
    finally:
        await drop(transport, spec)


async def test_a_retry_copy_waiting_past_its_tier_delay_reads_as_overdue(transport, unique):
    """A retry copy still waiting 100 s past its 5 s tier's delay shows 100 s overdue, then 0."""
    spec = lane_spec(f"obs-overdue-{unique}")
    group = f"g-{unique}"
    tier = {"lane": spec.lane, "group": group, "tier": "5s"}
    try:
        async with partly_consumed(transport, spec, group, produced=1, committed=1):
            admin = transport.admin()
            (copy, *_) = await admin.group_lag(group, spec.retry_topic_names()[0])
            assert copy.oldest_unconsumed_ms is not None
            now_s = (copy.oldest_unconsumed_ms + 3_000) / 1000
            metrics = Metrics()
            value = metrics.registry.get_sample_value
            source = GroupLagSource(
                admin,
                lane_watches([spec], only_groups=[group]),
                LagMetrics(metrics),
                clock=lambda: now_s,
            )
            await source.refresh()
            assert value("pipeline_retry_tier_overdue_seconds", tier) == 0  # not due yet

            now_s = (copy.oldest_unconsumed_ms + 105_000) / 1000
            await source.refresh()
            assert value("pipeline_retry_tier_messages", tier) == 1
            assert value("pipeline_retry_tier_overdue_seconds", tier) == pytest.approx(100.0)
            assert source.reports[0].retry_overdue_s == {"5s": pytest.approx(100.0)}
    finally:
        await drop(transport, spec)
