"""Plan and apply topic declarations against a broker, through the :class:`Admin` protocol only.

:func:`plan` compares every topic a declaration owns (main, retry tiers, dead letter) with what
the broker reports and lists the actions that bring the broker up to the declarations;
:func:`apply` runs them. Both are additive: topics are never deleted and partitions never shrink
(a declaration with fewer partitions than the broker is an error, since shrinking would move keys
to other partitions). Planning is deterministic (declaration order, then main, retry tiers
shortest first, dead letter), so a dry run shows exactly what a real run does.

Partitions, retention, Kafka's ``max.message.bytes`` (on retry tiers and dead-letter topics
:data:`~pipeline.transport.limits.COPY_HEADROOM_BYTES` above the main topic's, for the headers a
copy adds) and, on Redis Streams, ``max_len`` are compared (what :class:`TopicInfo` reports);
other ``configs`` are sent when a topic is created and again whenever it is updated for one of
those.

:func:`hazards` names what a change does to work already waiting, which the broker alone cannot
show: partitions added to an ordered lane (its keys move), retry tiers and a default dead-letter
topic no longer declared while they hold messages (no member reads a tier it is not declared
with), and a retention or ``max_len`` lowered (the broker deletes waiting work past it).
:func:`apply` reports each as one warning line, dry run or not.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from pipeline.errors import TopicSpecError
from pipeline.topics.spec import format_duration_ms
from pipeline.transport.limits import COPY_HEADROOM_BYTES

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from pipeline.topics.spec import TopicSpec
    from pipeline.transport.protocol import Admin, TopicConfig, TopicInfo

__all__ = ["Action", "ActionKind", "apply", "hazards", "plan"]

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
            ``max.message.bytes``, so nothing the ingress accepts is refused by the broker;
            retry tiers and dead-letter topics get :data:`COPY_HEADROOM_BYTES` more than their
            main topic (declared or this), so a copy of anything it took can be routed.

    Raises:
        TopicSpecError: a declaration has fewer partitions than the broker's topic (every such
            topic is named with both counts), two declarations own the same topic, or one sets
            ``max.message.bytes`` below ``max_message_bytes``.
    """
    actions: list[Action] = []
    owner = {name: spec.name for spec in specs for name in spec.topic_names()}
    shrinks: dict[str, list[tuple[TopicConfig, TopicInfo]]] = {}
    for config in _desired(specs, default_max_len, max_message_bytes).values():
        info = existing.get(config.name)
        if info is None:
            actions.append(Action("create", config.name, _describe_new(config)))
            continue
        if config.partitions < info.partitions:
            shrinks.setdefault(owner.get(config.name, config.name), []).append((config, info))
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
        raise TopicSpecError("\n".join(_shrink_line(found) for found in shrinks.values()))
    return actions


def _shrink_line(found: Sequence[tuple[TopicConfig, TopicInfo]]) -> str:
    """One line for a declaration whose topics have more partitions than it declares."""
    config, info = found[0]
    also = [c.name for c, i in found[1:] if i.partitions == info.partitions]
    odd = [f"{c.name} has {i.partitions}" for c, i in found[1:] if i.partitions != info.partitions]
    tail = "".join(f" ({', '.join(names)} too)" for names in (also, odd) if names)
    return (
        f"topic {config.name!r}: declared with {config.partitions} partitions but the broker has "
        f"{info.partitions}{tail}; partitions cannot be reduced (keys would move partition): "
        f"declare {info.partitions} again"
    )


async def apply(
    admin: Admin,
    specs: Sequence[TopicSpec],
    default_max_len: int,
    *,
    dry_run: bool,
    max_message_bytes: int | None = None,
    warn: Callable[[str], None] | None = None,
) -> list[Action]:
    """Plan against the broker's current topics and, unless ``dry_run``, carry the plan out.

    Before anything runs, each of :func:`hazards`' lines goes to ``warn`` (default: a warning
    logged by this module): they are not refusals, the plan is carried out all the same.

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
        warn: where each hazard line goes.

    Returns:
        The planned actions, all carried out unless ``dry_run``.

    Raises:
        TopicSpecError: the plan is impossible (see :func:`plan`); nothing was changed.
        TransportError: the broker refused an action; earlier actions stay applied.
    """
    existing = await admin.list_topics()
    actions = plan(specs, existing, default_max_len, max_message_bytes)
    for line in hazards(specs, existing, default_max_len):
        if warn is None:
            logger.warning("%s", line)
        else:
            warn(line)
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


def hazards(
    specs: Sequence[TopicSpec], existing: Mapping[str, TopicInfo], default_max_len: int
) -> list[str]:
    """One line for each change of ``specs`` that strands, reorders or deletes waiting work.

    Each line names the lane, the topics, what happens to the work waiting in them and what to
    do. Work kept in the members' Redis (held followers, debounce buffers) is
    :func:`pipeline.topics.stranded.stranded_in_redis`'s; the rest (``max_attempts``, a
    declaration removed) is in docs/topics.md, "Changing a running lane".

    Args:
        specs: the declarations about to be applied.
        existing: the broker's topics by name (:meth:`Admin.list_topics`).
        default_max_len: Redis Streams entries kept per partition when a spec sets no max_len.
    """
    lines: list[str] = []
    declared = {name for spec in specs for name in spec.topic_names()}
    for spec in specs:
        where = f"lane {spec.lane!r}"
        main = existing.get(spec.name)
        if main is not None and spec.ordered and spec.partitions > main.partitions:
            lines.append(
                f"{where}: {spec.name} goes from {main.partitions} to {spec.partitions} "
                "partitions, so most keys move to another partition: a key's messages still "
                "waiting on its old partition (and in its retry tiers) can run after or beside "
                "its new ones, out of order; add partitions while the lane's group has no lag "
                "(pipeline status), with the ingress stopped if order must hold"
            )
        retired = sorted(
            name
            for name, info in existing.items()
            if name.startswith(f"{spec.name}.retry.")
            and name not in declared
            and info.message_count
        )
        if retired:
            held = ", ".join(f"{n} ({_count(existing[n].message_count)})" for n in retired)
            lines.append(
                f"{where}: retry tier topic(s) {held} no longer declared: members read only "
                "the tiers declared now, so copies still waiting there never run (nor the "
                "followers of an ordered lane parked behind them); keep the old tier in "
                "retry.tiers until the lane's group has no lag on it (pipeline status), then "
                "remove it"
            )
        old_dlq = existing.get(f"{spec.name}.dlq")
        if old_dlq is not None and old_dlq.name not in declared and old_dlq.message_count:
            one = old_dlq.message_count == 1
            lines.append(
                f"{where}: dead letters now go to {spec.dead_letter}; the "
                f"{_count(old_dlq.message_count)} in {old_dlq.name} "
                f"{'stays' if one else 'stay'} there: redrive "
                f"{'it' if one else 'them'} from {old_dlq.name} "
                "(pipeline redrive)"
            )
        lines.extend(_shorter_keep(where, spec, existing, default_max_len))
    return lines


def _shorter_keep(
    where: str, spec: TopicSpec, existing: Mapping[str, TopicInfo], default_max_len: int
) -> list[str]:
    """Lines for a retention (Kafka) or ``max_len`` (Redis Streams) lowered on a lane's topics."""
    retention: list[str] = []
    length: list[str] = []
    for config in spec.topic_configs(default_max_len):
        info = existing.get(config.name)
        if info is None or not info.message_count:
            continue
        # Redis Streams keeps by length (max_len); its retention_ms is shown, never enforced.
        if info.max_len is None and config.retention_ms is not None:
            old = info.retention_ms
            if old is not None and (old < 0 or config.retention_ms < old):
                retention.append(
                    f"{config.name} {_describe_retention(old)} -> "
                    f"{_describe_retention(config.retention_ms)}"
                )
        if (
            info.max_len is not None
            and config.max_len is not None
            and config.max_len < info.max_len
        ):
            length.append(f"{config.name} {info.max_len} -> {config.max_len}")
    lines: list[str] = []
    if retention:
        lines.append(
            f"{where}: retention lowered ({', '.join(retention)}): the broker deletes messages "
            "older than that whether or not a member has read them (a lagging group's backlog, "
            "retry copies, dead letters); check the lane's oldest unconsumed age (pipeline "
            "status) first"
        )
    if length:
        lines.append(
            f"{where}: max_len lowered ({', '.join(length)}): the next sends trim each "
            "partition's stream to about that many entries whether or not a member has read "
            "them; check the lane's group lag (pipeline status) first"
        )
    return lines


def _count(messages: int) -> str:
    return f"{messages} message{'' if messages == 1 else 's'}"


def _desired(
    specs: Sequence[TopicSpec], default_max_len: int, max_message_bytes: int | None = None
) -> dict[str, TopicConfig]:
    """Every declared topic by name, in plan order, with its message size limit.

    A lane's retry tiers and dead-letter topic take :data:`COPY_HEADROOM_BYTES` more than its
    main topic: a copy is the message plus the headers the router adds.
    """
    desired: dict[str, TopicConfig] = {}
    for spec in specs:
        for config in spec.topic_configs(default_max_len):
            if config.name in desired:
                raise TopicSpecError(f"topic {config.name!r} is declared more than once")
            sized = _with_size_limit(config, max_message_bytes)
            if config.name != spec.name:
                sized = _with_copy_headroom(sized)
            desired[config.name] = sized
    return desired


def _with_copy_headroom(config: TopicConfig) -> TopicConfig:
    """``config`` of a retry tier or dead-letter topic: its limit raised by the copy headroom."""
    limit = config.configs.get(_MAX_BYTES)
    if limit is None:  # neither declared nor PIPELINE_MAX_MESSAGE_BYTES: the broker's default
        return config
    return replace(
        config, configs={**config.configs, _MAX_BYTES: str(int(limit) + COPY_HEADROOM_BYTES)}
    )


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
