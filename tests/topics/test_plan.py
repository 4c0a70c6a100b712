"""The topic planner and applier, against a recording Admin double."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from pipeline.errors import TopicSpecError
from pipeline.topics.admin import Action, apply, plan
from pipeline.topics.spec import DLQ_MIN_RETENTION_MS, TopicSpec
from pipeline.transport.protocol import PartitionLag, TopicConfig, TopicInfo

DAY_MS = 86_400_000
WEEK_MS = 7 * DAY_MS
MAX_LEN = 1_000


class RecordingAdmin:
    """An Admin that reports fixed topics and records every call made to it."""

    def __init__(self, topics: dict[str, TopicInfo] | None = None) -> None:
        """Start with ``topics`` on the broker and no calls recorded."""
        self.topics = dict(topics or {})
        self.calls: list[tuple[str, object]] = []

    async def list_topics(self, names: Collection[str] | None = None) -> dict[str, TopicInfo]:
        """Report the fixed topics (those of ``names``)."""
        self.calls.append(("list_topics", None))
        return {n: t for n, t in self.topics.items() if names is None or n in names}

    async def create_topic(self, config: TopicConfig) -> None:
        """Record a creation."""
        self.calls.append(("create_topic", config))

    async def update_topic(self, config: TopicConfig) -> None:
        """Record an update."""
        self.calls.append(("update_topic", config))

    async def delete_topic(self, name: str) -> None:
        """Record a deletion (the planner must never ask for one)."""
        self.calls.append(("delete_topic", name))

    async def group_lag(self, group: str, topic: str) -> list[PartitionLag]:
        """Not used by the planner."""
        raise NotImplementedError

    async def close(self) -> None:
        """Record closing."""
        self.calls.append(("close", None))


def messages_spec(**fields: object) -> TopicSpec:
    """The ``messages`` declaration: 12 partitions, 7 days, tiers 5s and 1m, plus ``fields``."""
    declaration = {
        "name": "messages",
        "partitions": 12,
        "retention": "7d",
        "retry": {"tiers": ["5s", "1m"]},
    }
    return TopicSpec.model_validate(declaration | fields)


def broker_state(spec: TopicSpec) -> dict[str, TopicInfo]:
    """What the broker reports once ``spec`` has been applied exactly."""
    return {
        config.name: TopicInfo(config.name, config.partitions, config.retention_ms, ())
        for config in spec.topic_configs(MAX_LEN)
    }


def test_plan_creates_every_missing_topic_in_order():
    """On an empty broker the main, retry and dead-letter topics are created in that order."""
    actions = plan([messages_spec()], {}, MAX_LEN)
    assert [str(action) for action in actions] == [
        "create messages (12 partitions, retention 7d)",
        "create messages.retry.5s (12 partitions, retention 7d)",
        "create messages.retry.1m (12 partitions, retention 7d)",
        "create messages.dlq (12 partitions, retention 14d)",
    ]


def test_plan_shows_broker_default_retention():
    """A spec without retention says the broker default is kept."""
    spec = TopicSpec.model_validate({"name": "events", "partitions": 3})
    assert (
        str(plan([spec], {}, MAX_LEN)[0])
        == "create events (3 partitions, retention broker default)"
    )


def test_plan_is_empty_when_the_broker_matches():
    """A broker that already has every declared topic as declared needs nothing."""
    spec = messages_spec()
    assert plan([spec], broker_state(spec), MAX_LEN) == []


def test_plan_creates_only_what_is_missing():
    """A newly added retry tier creates its topic and leaves the others alone."""
    existing = broker_state(messages_spec())
    spec = messages_spec(retry={"tiers": ["5s", "1m", "10m"]})
    assert plan([spec], existing, MAX_LEN) == [
        Action("create", "messages.retry.10m", "12 partitions, retention 7d")
    ]


def test_plan_grows_partitions_of_every_derived_topic():
    """More declared partitions add partitions to the main, retry and dead-letter topics."""
    existing = broker_state(messages_spec())
    actions = plan([messages_spec(partitions=24)], existing, MAX_LEN)
    assert {action.kind for action in actions} == {"add_partitions"}
    assert [action.topic for action in actions] == list(existing)
    assert str(actions[0]) == "add_partitions messages (12 -> 24 partitions)"


def test_plan_refuses_to_shrink_partitions():
    """Fewer declared partitions than the broker has is an error naming topic and both counts."""
    existing = broker_state(messages_spec(partitions=24))
    with pytest.raises(TopicSpecError) as info:
        plan([messages_spec()], existing, MAX_LEN)
    message = str(info.value)
    assert "topic 'messages': declared with 12 partitions but the broker has 24" in message
    assert "cannot be reduced" in message


def test_plan_updates_configs_when_retention_differs():
    """A changed retention updates main and retry topics; the DLQ keeps its 14-day floor."""
    existing = broker_state(messages_spec())
    actions = plan([messages_spec(retention="3d")], existing, MAX_LEN)
    assert [str(action) for action in actions] == [
        "update_configs messages (retention 7d -> 3d)",
        "update_configs messages.retry.5s (retention 7d -> 3d)",
        "update_configs messages.retry.1m (retention 7d -> 3d)",
    ]


def test_plan_leaves_retention_alone_when_the_spec_has_none():
    """Without a declared retention the broker's value is not compared."""
    spec = TopicSpec.model_validate({"name": "events", "partitions": 3})
    existing = {
        "events": TopicInfo("events", 3, WEEK_MS, ()),
        "events.dlq": TopicInfo("events.dlq", 3, DLQ_MIN_RETENTION_MS, ()),
    }
    assert plan([spec], existing, MAX_LEN) == []


def test_plan_rejects_two_specs_owning_one_topic():
    """Specs passed directly (not through load_specs) still cannot declare a topic twice."""
    with pytest.raises(TopicSpecError, match="'messages' is declared more than once"):
        plan([messages_spec(), messages_spec()], {}, MAX_LEN)


async def test_apply_dry_run_only_lists_topics():
    """A dry run returns the plan and changes nothing on the broker."""
    admin = RecordingAdmin()
    actions = await apply(admin, [messages_spec()], MAX_LEN, dry_run=True)
    assert [action.kind for action in actions] == ["create"] * 4
    assert admin.calls == [("list_topics", None)]


async def test_apply_creates_topics_in_plan_order():
    """A real run creates each missing topic with its full config, in plan order."""
    spec = messages_spec()
    admin = RecordingAdmin()
    actions = await apply(admin, [spec], MAX_LEN, dry_run=False)
    assert admin.calls == [
        ("list_topics", None),
        *(("create_topic", config) for config in spec.topic_configs(MAX_LEN)),
    ]
    assert [action.topic for action in actions] == [
        "messages",
        "messages.retry.5s",
        "messages.retry.1m",
        "messages.dlq",
    ]


async def test_apply_creates_and_updates_in_order_once_per_topic():
    """Mixed actions run in order, with one update_topic per topic even for two actions."""
    old = messages_spec()
    existing = broker_state(old)
    del existing["messages.dlq"]
    spec = messages_spec(partitions=24, retention="3d", retry={"tiers": ["5s"]})
    admin = RecordingAdmin(existing)
    actions = await apply(admin, [spec], MAX_LEN, dry_run=False)
    main, retry, dlq = spec.topic_configs(MAX_LEN)
    assert [(action.kind, action.topic) for action in actions] == [
        ("add_partitions", "messages"),
        ("update_configs", "messages"),
        ("add_partitions", "messages.retry.5s"),
        ("update_configs", "messages.retry.5s"),
        ("create", "messages.dlq"),
    ]
    assert admin.calls == [
        ("list_topics", None),
        ("update_topic", main),
        ("update_topic", retry),
        ("create_topic", dlq),
    ]


async def test_apply_refuses_to_shrink_before_changing_anything():
    """An impossible plan raises before any create or update is sent."""
    admin = RecordingAdmin(broker_state(messages_spec(partitions=24)))
    with pytest.raises(TopicSpecError, match="cannot be reduced"):
        await apply(
            admin, [messages_spec(retry={"tiers": ["5s", "1m", "1h"]})], MAX_LEN, dry_run=False
        )
    assert admin.calls == [("list_topics", None)]


def test_action_str_reads_as_a_sentence():
    """The human form is the kind, the topic and the detail in brackets."""
    action = Action("create", "messages.retry.5s", "12 partitions, retention 7d")
    assert str(action) == "create messages.retry.5s (12 partitions, retention 7d)"
