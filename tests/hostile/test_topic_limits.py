"""A 2xx is never given for what the broker cannot take: body caps against Kafka topic limits."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
import yaml
from ingress.helpers import META, build
from support import test_settings

from pipeline.config import IngressSettings, SweeperSettings
from pipeline.errors import ConfigError
from pipeline.ingress import source as source_module
from pipeline.ingress.service import build_ingress
from pipeline.ingress.source import check_topic_limits
from pipeline.topics.admin import apply
from pipeline.topics.spec import load_specs
from pipeline.transport import create_transport
from pipeline.transport.protocol import TopicConfig

KAFKA_DEFAULT_MAX_MESSAGE_BYTES = "1048588"


def _files(tmp_path: Path, topic: str) -> IngressSettings:
    (tmp_path / "topics").mkdir()
    (tmp_path / "topics" / "t.yaml").write_text(
        yaml.safe_dump({"name": topic, "partitions": 1}), encoding="utf-8"
    )
    sources = {"sources": {"plain": {"scheme": "none", "topic": topic}}}
    (tmp_path / "sources.yaml").write_text(yaml.safe_dump(sources), encoding="utf-8")
    return IngressSettings(
        sources_file=tmp_path / "sources.yaml",
        sqlite_path=tmp_path / "ingress.db",
        sweeper=SweeperSettings(enabled=False),
    )


async def test_the_ingress_refuses_to_start_over_a_topic_too_small_for_its_cap(
    tmp_path: Path, kafka_service: str
) -> None:
    """A 1 MiB body cap over a topic at Kafka's default limit stops the start, naming both."""
    del kafka_service
    topic = f"limits_{uuid.uuid4().hex[:10]}"
    ingress = _files(tmp_path, topic)
    settings = test_settings(topics_dir=tmp_path / "topics", transport="kafka")
    admin_transport = create_transport(settings)
    admin = admin_transport.admin()
    await admin.create_topic(
        TopicConfig(topic, 1, configs={"max.message.bytes": KAFKA_DEFAULT_MAX_MESSAGE_BYTES})
    )
    built = build_ingress(settings, ingress)
    try:
        with pytest.raises(ConfigError, match=f"max.message.bytes=1048588 of topic '{topic}'"):
            await built.start()
        await apply(
            admin,
            load_specs(tmp_path / "topics"),
            1000,
            dry_run=False,
            max_message_bytes=settings.max_message_bytes,
        )
        limit = (await admin.list_topics([topic]))[topic].max_message_bytes
        await built.start()  # the applied limit fits the cap
        await built.stop()
    finally:
        await built.transport.close()
        for name in (topic, f"{topic}.dlq"):
            await admin.delete_topic(name)
        await admin_transport.close()
    assert limit == settings.max_message_bytes


async def test_a_broker_that_does_not_answer_skips_the_check_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The ingress starts without the broker: the check is skipped, with a reason in the line."""
    monkeypatch.setattr(source_module, "_CHECK_TIMEOUT_S", 0.5)
    settings = test_settings(transport="kafka")
    kafka = settings.kafka.model_copy(update={"bootstrap_servers": "127.0.0.1:1"})
    transport = create_transport(settings.model_copy(update={"kafka": kafka}))
    sources = build(tmp_path, {"whatsapp": META}, {"messages": "messages", "engagement": "e"})
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline.ingress.source"):
            await check_topic_limits(sources, transport.admin())  # returns: nothing to refuse
    finally:
        await transport.close()
    (line,) = [r.getMessage() for r in caplog.records if "size limits" in r.getMessage()]
    assert line == "topic size limits not checked (broker unreachable): no answer within 0.5 s"
