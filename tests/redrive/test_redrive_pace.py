"""A rate-capped redrive on Kafka: its batches stay within the group's poll interval."""

from __future__ import annotations

import asyncio

from runtime.helpers import declare, lane_spec, produce

from pipeline import headers as h
from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.redrive.redrive import Redrive
from pipeline.redrive.select import Selection
from pipeline.transport import create_transport


async def test_a_slow_redrive_commits_before_the_poll_interval_runs_out(
    settings: Settings, kafka_service: str, unique: str
) -> None:
    """A batch sent slower than ``max.poll.interval.ms`` allows no longer loops on its commit.

    With 200 messages a poll, ``--rate`` below 0.67/s (200 in more than the default 300 s)
    dropped the run from its group before it committed: the commit failed ('Unknown member'),
    and each run again sent the same 200 again. Here the interval is shrunk to 6 s (twice the
    suite's 3 s session timeout, which it may not be below) and the rate raised to 6/s, so that
    60 messages take 10 s.
    """
    kafka = settings.kafka.model_copy(update={"client": {"max.poll.interval.ms": "6000"}})
    transport = create_transport(settings.model_copy(update={"kafka": kafka}), "kafka")
    try:
        spec = lane_spec(f"rd_{unique}", 1)
        await declare(transport, spec)
        dlq = spec.dead_letter
        headers = {h.ORIGIN_TOPIC: spec.name.encode(), h.DEAD_REASON: b"fatal"}
        await produce(transport, dlq, [Record(b"v%d" % i, b"k", headers) for i in range(60)])
        job = Redrive(transport, dlq, Selection(), rate_per_s=6)
        report = await asyncio.wait_for(job.run(), 60)
        assert report.moved == 60
        assert (await Redrive(transport, dlq, Selection(), rate_per_s=6).run()).scanned == 0
        counts = await transport.admin().list_topics([spec.name])
        assert counts[spec.name].message_count == 60
    finally:
        await transport.close()
