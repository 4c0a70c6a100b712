"""docs/getting-started.md, run as written against real services: a signed webhook gets handled.

The guide runs on Redis Streams, and again on Kafka the way it tells a Kafka reader to
(``PIPELINE_TRANSPORT=kafka`` exported in each terminal).
"""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from shell import ROOT, blocks, reader
from support import IN_CI, delete_declared, delete_group_after_test, delete_topics_after_test

from pipeline.config import Settings
from pipeline.topics.spec import load_specs
from pipeline.transport import create_transport

GUIDE = ROOT / "docs" / "getting-started.md"
GROUP = "messages"
"""The consumer group the guide starts (``pipeline consume ... --group messages``)."""


@pytest.fixture(params=["redis", "kafka"])
async def kafka_topics(
    request: pytest.FixtureRequest, settings: Settings
) -> AsyncIterator[list[str] | None]:
    """None on Redis; on Kafka the guide's topics, absent before the run and deleted after it.

    Kafka has no key prefix: the guide declares ``messages`` and the other lanes by name. One
    run at a time on this machine holds a lock; topics that exist already belong to someone
    else (a demo on Kafka), so the run is skipped (failed in CI, whose broker is its own).
    """
    if request.param == "redis":
        yield None
        return
    request.getfixturevalue("kafka_service")
    names = [n for spec in load_specs(ROOT / "topics") for n in spec.topic_names()]
    with (Path(tempfile.gettempdir()) / "pipeline-guide-kafka.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        transport = create_transport(settings, "kafka")
        try:
            present = sorted(await transport.admin().list_topics(names))
        finally:
            await transport.close()
        if present:
            why = f"the guide's topics exist on Kafka already ({', '.join(present)}): not ours"
            if IN_CI:
                pytest.fail(why)
            pytest.skip(why)
        delete_topics_after_test(settings, "kafka", names)
        delete_group_after_test(settings, "kafka", GROUP, names)
        try:
            yield names
        finally:
            await delete_declared()


@pytest.mark.timeout(240)
async def test_the_guide_runs_as_written(
    kafka_topics: list[str] | None, tmp_path: Path, prefix: str, redis: Redis, settings: Settings
) -> None:
    """Every sh block of the guide runs, prints what the guide shows, and stops cleanly."""
    kafka = None if kafka_topics is None else settings.kafka.bootstrap_servers
    session = reader(tmp_path, prefix, settings.redis.url, kafka=kafka)
    ran = 0
    try:
        for block in blocks(GUIDE.read_text(encoding="utf-8")):
            session.run(block)
            ran += len(block.steps) + len(block.shown)
    finally:
        codes = session.close()
    assert ran >= 15, "\n".join(session.transcript)
    assert [c.split()[:2] for c in codes] == [["pipeline", "consume"], ["pipeline", "ingress"]]
    for command, code in codes.items():
        assert code in {0, 130}, f"{command} exited {code} on Ctrl-C"  # 130: stopped by SIGINT
    for background in session.running:
        assert "Traceback" not in background.output, background.output
    consumer = session.running[1].output
    assert "dead letter on lane messages: fatal: DeadLetter: empty message" in consumer
    if kafka_topics is None:
        assert await redis.exists(f"{prefix}:topics")
        return
    on_kafka = create_transport(settings, "kafka")
    try:
        assert sorted(await on_kafka.admin().list_topics(kafka_topics)) == sorted(kafka_topics)
    finally:
        await on_kafka.close()
