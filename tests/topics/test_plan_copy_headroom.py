"""Retry tiers and dead-letter topics take a copy's headroom more than their main topic."""

from __future__ import annotations

import pytest

from pipeline.errors import TopicSpecError
from pipeline.topics.admin import apply, plan
from pipeline.topics.spec import TopicSpec
from pipeline.transport.limits import COPY_HEADROOM_BYTES
from pipeline.transport.protocol import TopicConfig, TopicInfo

MAX_LEN = 1_000
LIMIT = 1_114_112


def spec(**fields: object) -> TopicSpec:
    """``m``: 3 partitions, tiers 5s and 1m, plus ``fields``."""
    return TopicSpec.model_validate(
        {"name": "m", "partitions": 3, "retry": {"tiers": ["5s", "1m"]}} | fields
    )


def on_broker(limits: dict[str, int]) -> dict[str, TopicInfo]:
    """``m``'s topics as a Kafka broker reports them, with these ``max.message.bytes``."""
    return {
        config.name: TopicInfo(
            config.name, 3, config.retention_ms, (), max_message_bytes=limits[config.name]
        )
        for config in spec().topic_configs(MAX_LEN)
    }


class CreatingAdmin:
    """An Admin double with no topics that keeps the configs it is asked to create."""

    def __init__(self) -> None:
        """Nothing created yet."""
        self.created: list[TopicConfig] = []

    async def list_topics(self, names: object = None) -> dict[str, TopicInfo]:
        """No topics (of ``names`` or any)."""
        del names
        return {}

    async def create_topic(self, config: TopicConfig) -> None:
        """Keep ``config``."""
        self.created.append(config)


async def test_copy_topics_are_created_with_the_headroom() -> None:
    """Main at PIPELINE_MAX_MESSAGE_BYTES; tiers and DLQ that plus COPY_HEADROOM_BYTES."""
    admin = CreatingAdmin()
    await apply(admin, [spec()], MAX_LEN, dry_run=False, max_message_bytes=LIMIT)  # type: ignore[arg-type]
    limits = {c.name: int(c.configs["max.message.bytes"]) for c in admin.created}
    copies = LIMIT + COPY_HEADROOM_BYTES
    assert limits == {"m": LIMIT, "m.retry.5s": copies, "m.retry.1m": copies, "m.dlq": copies}


async def test_a_declared_limit_gets_the_headroom_on_copy_topics() -> None:
    """A declared ``max.message.bytes`` is the main topic's; its copies take the headroom more."""
    admin = CreatingAdmin()
    declared = spec(configs={"max.message.bytes": 2_097_152})
    await apply(admin, [declared], MAX_LEN, dry_run=False, max_message_bytes=LIMIT)  # type: ignore[arg-type]
    limits = {c.name: int(c.configs["max.message.bytes"]) for c in admin.created}
    assert limits["m"] == 2_097_152
    assert limits["m.dlq"] == limits["m.retry.5s"] == 2_097_152 + COPY_HEADROOM_BYTES


def test_existing_copy_topics_are_raised_by_an_update() -> None:
    """Topics applied before the headroom: an update of each tier and the DLQ, not the main."""
    existing = on_broker(dict.fromkeys(["m", "m.retry.5s", "m.retry.1m", "m.dlq"], LIMIT))
    actions = plan([spec()], existing, MAX_LEN, LIMIT)
    copies = LIMIT + COPY_HEADROOM_BYTES
    assert [str(a) for a in actions] == [
        f"update_configs {name} (max.message.bytes {LIMIT} -> {copies})"
        for name in ("m.retry.5s", "m.retry.1m", "m.dlq")
    ]
    raised = on_broker({"m": LIMIT} | dict.fromkeys(["m.retry.5s", "m.retry.1m", "m.dlq"], copies))
    assert plan([spec()], raised, MAX_LEN, LIMIT) == []


async def test_without_a_limit_the_broker_default_stays() -> None:
    """No PIPELINE_MAX_MESSAGE_BYTES and none declared: no topic gets a max.message.bytes."""
    admin = CreatingAdmin()
    await apply(admin, [spec()], MAX_LEN, dry_run=False)  # type: ignore[arg-type]
    assert len(admin.created) == 4
    assert all("max.message.bytes" not in c.configs for c in admin.created)


def test_a_declared_limit_below_the_pipelines_is_still_refused() -> None:
    """The main topic's limit is checked as before (the copies' is derived from it)."""
    with pytest.raises(TopicSpecError, match="is below PIPELINE_MAX_MESSAGE_BYTES"):
        plan([spec(configs={"max.message.bytes": 1_000_000})], {}, MAX_LEN, LIMIT)
