"""Plan and apply topic declarations against a broker, through the :class:`Admin` protocol only.

:func:`plan` compares every topic a declaration owns (main, retry tiers, dead letter) with what
the broker reports and lists the actions that bring the broker up to the declarations;
:func:`apply` runs them. Both are additive: topics are never deleted and partitions never shrink
(a declaration with fewer partitions than the broker is an error, since shrinking would move keys
to other partitions). Planning is deterministic (declaration order, then main, retry tiers
shortest first, dead letter), so a dry run shows exactly what a real run does.

Partitions, retention, Kafka's ``max.message.bytes`` and, on Redis Streams, ``max_len`` are
compared (what :class:`TopicInfo` reports); other ``configs`` are sent when a topic is created and
again whenever it is updated for one of those.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from pipeline.errors import TopicSpecError
from pipeline.topics.spec import format_duration_ms

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pipeline.topics.spec import TopicSpec
    from pipeline.transport.protocol import Admin, TopicConfig, TopicInfo

__all__ = ["Action", "ActionKind", "apply", "plan"]

logger = logging.getLogger(__name__)

ActionKind = Literal["create", "add_partitions", "update_configs"]


@dataclass(frozen=True, slots=True)
class Action:
    """One change to a broker's topics.

    Attributes:
        kind: ``create`` a missing topic, ``add_partitions`` to an existing one, or
            ``update_configs`` when its retention, ``max.message.bytes`` (Kafka) or ``max_len``
            (Redis Streams) differs from the declaration.
        topic: the topic's name.
        detail: what changes, for people (``12 partitions, retention 7d``).
    """

    kind: ActionKind
    topic: str
    detail: str

    def __str__(self) -> str:
        """Human form, such as ``create messages.retry.5s (12 partitions, retention 7d)``."""
        return f"{self.kind} {self.topic} ({self.detail})"


_MAX_BYTES = "max.message.bytes"


def plan(
    specs: Sequence[TopicSpec],
    existing: Mapping[str, TopicInfo],
    default_max_len: int,
    max_message_bytes: int | None = None,
) -> list[Action]:
    """List the actions that bring the broker's topics up to ``specs``; empty when they match.

    Args:
        specs: the declarations, usually from :func:`pipeline.topics.spec.load_specs`.
        existing: the broker's topics by name (:meth:`Admin.list_topics`).
        default_max_len: Redis Streams entries kept per partition when a spec sets no max_len.
        max_message_bytes: the largest message the pipeline produces
            (``PIPELINE_MAX_MESSAGE_BYTES``): every Kafka topic gets at least this
            ``max.message.bytes``, so nothing the ingress accepts is refused by the broker.

    Raises:
        TopicSpecError: a declaration has fewer partitions than the broker's topic (every such
            topic is named with both counts), two declarations own the same topic, or one sets
            ``max.message.bytes`` below ``max_message_bytes``.
    """
    actions: list[Action] = []
    shrinks: list[str] = []
    for config in _desired(specs, default_max_len, max_message_bytes).values():
        info = existing.get(config.name)
        if info is None:
            actions.append(Action("create", config.name, _describe_new(config)))
            continue
        if config.partitions < info.partitions:
            shrinks.append(
                f"topic {config.name!r}: declared with {config.partitions} partitions but the "
                f"broker has {info.partitions}; partitions cannot be reduced"
            )
        elif config.partitions > info.partitions:
            detail = f"{info.partitions} -> {config.partitions} partitions"
            actions.append(Action("add_partitions", config.name, detail))
        # No declared retention means "the broker's default": nothing to compare against.
        if config.retention_ms is not None and config.retention_ms != info.retention_ms:
            detail = (
                f"retention {_describe_retention(info.retention_ms)} -> "
                f"{_describe_retention(config.retention_ms)}"
            )
            actions.append(Action("update_configs", config.name, detail))
        # Only Redis Streams keeps a topic by length; the other transports report None.
        if info.max_len is not None and config.max_len not in {None, info.max_len}:
            detail = f"max_len {info.max_len} -> {config.max_len}"
            actions.append(Action("update_configs", config.name, detail))
        wanted = config.configs.get(_MAX_BYTES)
        if wanted is not None and info.max_message_bytes not in {None, int(wanted)}:
            detail = f"{_MAX_BYTES} {info.max_message_bytes} -> {wanted}"
            actions.append(Action("update_configs", config.name, detail))
    if shrinks:
        raise TopicSpecError("\n".join(shrinks))
    return actions


async def apply(
    admin: Admin,
    specs: Sequence[TopicSpec],
    default_max_len: int,
    *,
    dry_run: bool,
    max_message_bytes: int | None = None,
) -> list[Action]:
    """Plan against the broker's current topics and, unless ``dry_run``, carry the plan out.

    Actions run in plan order: :meth:`Admin.create_topic` for ``create``, and
    :meth:`Admin.update_topic` for the others, called once per topic because it applies
    partitions, retention and configs together. Applying is idempotent: after a failure part-way,
    running again plans only what is still missing.

    Args:
        admin: the broker's admin client.
        specs: the declarations to apply.
        default_max_len: Redis Streams entries kept per partition when a spec sets no max_len.
        dry_run: plan only; change nothing.
        max_message_bytes: the least ``max.message.bytes`` of every Kafka topic (see
            :func:`plan`); None leaves the broker's default.

    Returns:
        The planned actions, all carried out unless ``dry_run``.

    Raises:
        TopicSpecError: the plan is impossible (see :func:`plan`); nothing was changed.
        TransportError: the broker refused an action; earlier actions stay applied.
    """
    actions = plan(specs, await admin.list_topics(), default_max_len, max_message_bytes)
    if dry_run:
        return actions
    desired = _desired(specs, default_max_len, max_message_bytes)
    updated: set[str] = set()
    for action in actions:
        config = desired[action.topic]
        if action.kind == "create":
            await admin.create_topic(config)
        elif action.topic not in updated:
            await admin.update_topic(config)
            updated.add(action.topic)
        logger.info("topic %s", action)
    return actions


def _desired(
    specs: Sequence[TopicSpec], default_max_len: int, max_message_bytes: int | None = None
) -> dict[str, TopicConfig]:
    """Every declared topic by name, in plan order, with its message size limit."""
    desired: dict[str, TopicConfig] = {}
    for spec in specs:
        for config in spec.topic_configs(default_max_len):
            if config.name in desired:
                raise TopicSpecError(f"topic {config.name!r} is declared more than once")
            desired[config.name] = _with_size_limit(config, max_message_bytes)
    return desired


def _with_size_limit(config: TopicConfig, max_message_bytes: int | None) -> TopicConfig:
    """``config`` taking at least ``max_message_bytes`` per message (``max.message.bytes``)."""
    if max_message_bytes is None:
        return config
    declared = config.configs.get(_MAX_BYTES)
    if declared is None:
        return replace(config, configs={**config.configs, _MAX_BYTES: str(max_message_bytes)})
    if int(declared) < max_message_bytes:
        raise TopicSpecError(
            f"topic {config.name!r}: {_MAX_BYTES}={declared} is below "
            f"PIPELINE_MAX_MESSAGE_BYTES={max_message_bytes}: the ingress could accept webhooks "
            "the broker then refuses; raise it, or lower PIPELINE_MAX_MESSAGE_BYTES"
        )
    return config


def _describe_new(config: TopicConfig) -> str:
    return f"{config.partitions} partitions, retention {_describe_retention(config.retention_ms)}"


def _describe_retention(retention_ms: int | None) -> str:
    # Kafka reports "keep forever" as -1, which format_duration_ms shows as "-1ms".
    return "broker default" if retention_ms is None else format_duration_ms(retention_ms)
