"""How far each consumer group is behind on each lane, read from the transport's admin client.

One probe serves both the ``/metrics`` refresher and ``pipeline status``. For a lane and the
group that consumes it, :func:`probe_lane` reads :meth:`~pipeline.transport.protocol.Admin.
group_lag` on the lane's main topics (lag and the age of the oldest message not yet committed:
the alarm signal), on each retry tier topic (depth, and how long past the tier's delay its oldest
copy has waited), and the dead-letter topic's retained count.

Which group consumes a lane: :func:`lane_watches` takes an explicit mapping, and otherwise
assumes the group is named after the lane (the convention of ``deploy/k8s``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pipeline.errors import UnknownTopic
from pipeline.topics.spec import TopicSpec, format_duration_ms
from pipeline.transport.protocol import Admin, PartitionLag

__all__ = ["LaneReport", "LaneWatch", "lane_watches", "oldest_age_s", "probe_lane"]


@dataclass(frozen=True, slots=True)
class LaneWatch:
    """One (lane, group) pair to observe and the topics that make up the lane.

    Attributes:
        lane: the admission lane.
        group: the consumer group that consumes it.
        topics: the lane's main topics.
        retry_topics: each retry tier's label (``5s``, ``1m``) and its topics.
        dead_letters: the lane's dead-letter topics.
        retry_delays_ms: each retry tier's label and its delay in milliseconds.
    """

    lane: str
    group: str
    topics: tuple[str, ...]
    retry_topics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    dead_letters: tuple[str, ...] = ()
    retry_delays_ms: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LaneReport:
    """What one probe found for a (lane, group) pair.

    Attributes:
        lane: the admission lane.
        group: the consumer group.
        lag: messages on the main topics not yet committed by the group and still held (those
            that expired or were trimmed first are not counted).
        oldest_age_s: age of the oldest of them in seconds (0.0 when caught up).
        retry_tiers: messages waiting in each retry tier for the group, by tier label.
        dead_letters: messages retained in the dead-letter topics.
        missing_topics: topics of the lane the broker does not have (``pipeline topics apply``).
        retry_overdue_s: by tier label, how long past the tier's delay the oldest copy not yet
            committed by the group has waited, in seconds (0.0: none is past it). A copy is due
            at most the tier's delay after it was written (jitter only shortens it), so a
            positive value is a retry held up: no member reads the tier, or its run is still
            going.
    """

    lane: str
    group: str
    lag: int
    oldest_age_s: float
    retry_tiers: Mapping[str, int]
    dead_letters: int
    missing_topics: tuple[str, ...] = ()
    retry_overdue_s: Mapping[str, float] = field(default_factory=dict)


def lane_watches(
    specs: Sequence[TopicSpec],
    groups: Mapping[str, Sequence[str]] | None = None,
    *,
    only_groups: Sequence[str] = (),
) -> list[LaneWatch]:
    """The (lane, group) pairs to observe for the declared topics.

    Args:
        specs: the topic declarations (``topics/*.yaml``).
        groups: the consumer groups of each lane; a lane not in it is consumed by a group of
            its own name.
        only_groups: when given, these groups observe every lane instead.
    """
    by_lane: dict[str, list[TopicSpec]] = defaultdict(list)
    for spec in specs:
        by_lane[spec.lane].append(spec)
    watches: list[LaneWatch] = []
    for lane, lane_specs in sorted(by_lane.items()):
        tiers: dict[str, list[str]] = defaultdict(list)
        delays_ms: dict[str, int] = {}
        for spec in lane_specs:
            for delay_ms, topic in zip(spec.retry.tiers_ms, spec.retry_topic_names(), strict=True):
                tiers[format_duration_ms(delay_ms)].append(topic)
                delays_ms[format_duration_ms(delay_ms)] = delay_ms
        chosen = list(only_groups) or list((groups or {}).get(lane, ())) or [lane]
        watches.extend(
            LaneWatch(
                lane=lane,
                group=group,
                topics=tuple(spec.name for spec in lane_specs),
                retry_topics={tier: tuple(topics) for tier, topics in tiers.items()},
                dead_letters=tuple(spec.dead_letter for spec in lane_specs),
                retry_delays_ms=dict(delays_ms),
            )
            for group in chosen
        )
    return watches


def oldest_age_s(partitions: Sequence[PartitionLag], now_ms: int) -> float:
    """Age in seconds of the oldest uncommitted message over ``partitions`` (0.0: caught up)."""
    stamps = [p.oldest_unconsumed_ms for p in partitions if p.oldest_unconsumed_ms is not None]
    return max(0.0, (now_ms - min(stamps)) / 1000) if stamps else 0.0


async def retained_dead_letters(admin: Admin, watches: Sequence[LaneWatch]) -> dict[str, int]:
    """Messages retained per dead-letter topic of ``watches`` (for :func:`probe_lane`).

    Only those topics are listed: a periodic full listing of a large broker costs seconds.
    """
    dead = {topic for watch in watches for topic in watch.dead_letters}
    return {name: info.message_count for name, info in (await admin.list_topics(dead)).items()}


async def probe_lane(
    admin: Admin,
    watch: LaneWatch,
    retained: Mapping[str, int],
    *,
    clock: Callable[[], float] = time.time,
) -> LaneReport:
    """Read the lag, age, retry-tier depths and dead letters of one (lane, group) pair.

    Args:
        admin: the transport's admin client.
        watch: the lane and group.
        retained: messages retained per topic (from :meth:`Admin.list_topics`), for the
            dead-letter count.
        clock: Unix time in seconds.

    Raises:
        PipelineError: the broker could not be read (a missing topic is reported, not raised).
    """
    missing: list[str] = []
    main: list[PartitionLag] = []
    for topic in watch.topics:
        main.extend(await _lag(admin, watch.group, topic, missing))
    now_ms = int(clock() * 1000)
    tiers = {}
    overdue = {}
    for tier, topics in watch.retry_topics.items():
        held: list[PartitionLag] = []
        for topic in topics:
            held.extend(await _lag(admin, watch.group, topic, missing))
        tiers[tier] = sum(p.lag for p in held)
        delay_s = watch.retry_delays_ms.get(tier, 0) / 1000
        overdue[tier] = max(0.0, oldest_age_s(held, now_ms) - delay_s)
    dead = 0
    for topic in watch.dead_letters:
        if topic in retained:
            dead += retained[topic]
        else:
            missing.append(topic)
    return LaneReport(
        lane=watch.lane,
        group=watch.group,
        lag=sum(p.lag for p in main),
        oldest_age_s=oldest_age_s(main, now_ms),
        retry_tiers=tiers,
        dead_letters=dead,
        missing_topics=tuple(missing),
        retry_overdue_s=overdue,
    )


async def _lag(admin: Admin, group: str, topic: str, missing: list[str]) -> list[PartitionLag]:
    try:
        return await admin.group_lag(group, topic)
    except UnknownTopic:
        missing.append(topic)
        return []
