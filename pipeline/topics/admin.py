"""Plan and apply topic declarations against a broker, through the :class:`Admin` protocol only.

:func:`plan` compares every topic a declaration owns (main, retry tiers, dead letter) with what
the broker reports and lists the actions that bring the broker up to the declarations;
:func:`apply` runs them. Both are additive: topics are never deleted and partitions never shrink
(a declaration with fewer partitions than the broker is an error, since shrinking would move keys
to other partitions). Planning is deterministic (declaration order, then main, retry tiers
shortest first, dead letter), so a dry run shows exactly what a real run does.

Only partitions and retention are compared, because :class:`TopicInfo` reports nothing else;
``max_len`` and ``configs`` are sent when a topic is created and again whenever it is updated.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
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
            ``update_configs`` when its retention differs from the declaration.
        topic: the topic's name.
        detail: what changes, for people (``12 partitions, retention 7d``).
    """

    kind: ActionKind
    topic: str
    detail: str

    def __str__(self) -> str:
        """Human form, such as ``create messages.retry.5s (12 partitions, retention 7d)``."""
        return f"{self.kind} {self.topic} ({self.detail})"


def plan(
    specs: Sequence[TopicSpec],
    existing: Mapping[str, TopicInfo],
    default_max_len: int,
) -> list[Action]:
    """List the actions that bring the broker's topics up to ``specs``; empty when they match.

    Args:
        specs: the declarations, usually from :func:`pipeline.topics.spec.load_specs`.
        existing: the broker's topics by name (:meth:`Admin.list_topics`).
        default_max_len: Redis Streams entries kept per partition when a spec sets no max_len.

    Raises:
        TopicSpecError: a declaration has fewer partitions than the broker's topic (every such
            topic is named with both counts), or two declarations own the same topic.
    """
    actions: list[Action] = []
    shrinks: list[str] = []
    for config in _desired(specs, default_max_len).values():
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
    if shrinks:
        raise TopicSpecError("\n".join(shrinks))
    return actions


async def apply(
    admin: Admin,
    specs: Sequence[TopicSpec],
    default_max_len: int,
    *,
    dry_run: bool,
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

    Returns:
        The planned actions, all carried out unless ``dry_run``.

    Raises:
        TopicSpecError: the plan is impossible (see :func:`plan`); nothing was changed.
        TransportError: the broker refused an action; earlier actions stay applied.
    """
    actions = plan(specs, await admin.list_topics(), default_max_len)
    if dry_run:
        return actions
    desired = _desired(specs, default_max_len)
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


def _desired(specs: Sequence[TopicSpec], default_max_len: int) -> dict[str, TopicConfig]:
    """Every declared topic by name, in plan order."""
    desired: dict[str, TopicConfig] = {}
    for spec in specs:
        for config in spec.topic_configs(default_max_len):
            if config.name in desired:
                raise TopicSpecError(f"topic {config.name!r} is declared more than once")
            desired[config.name] = config
    return desired


def _describe_new(config: TopicConfig) -> str:
    return f"{config.partitions} partitions, retention {_describe_retention(config.retention_ms)}"


def _describe_retention(retention_ms: int | None) -> str:
    # Kafka reports "keep forever" as -1, which format_duration_ms shows as "-1ms".
    return "broker default" if retention_ms is None else format_duration_ms(retention_ms)
