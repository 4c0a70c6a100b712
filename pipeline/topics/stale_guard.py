"""A lane's guard state left in Redis when its main topic is created anew.

The run guard remembers the messages that finished by where they were first delivered
(``topic:partition:offset``), under the lane's keys ``{P:guard:LANE}``. A main topic deleted and
created again gives those positions out again, so while the keys stay a retry copy of a new
message at a reused position is taken for a late duplicate and dropped; the guard's WARNING
(:mod:`pipeline.runtime.guard`) tells it only once a message is lost. :func:`stale_guard_lines`
tells it when ``pipeline topics apply`` creates the topic: one line a lane, the keys to delete.
Nothing is deleted here: a member may still run, and deleting is the operator's call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.retry.keys import lane_tag

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    from redis.asyncio import Redis

    from pipeline.topics.admin import Action
    from pipeline.topics.spec import TopicSpec

__all__ = ["created_topics", "stale_guard_lines"]

_SCAN_COUNT = 1000


def created_topics(actions: Sequence[Action]) -> set[str]:
    """The topics ``actions`` created (carried out, not a dry run's plan)."""
    return {action.topic for action in actions if action.kind == "create"}


async def stale_guard_lines(
    redis: Redis, prefix: str, specs: Sequence[TopicSpec], created: Collection[str]
) -> list[str]:
    """One line for each lane whose main topic is in ``created`` while it has guard keys.

    Args:
        redis: the members' Redis (``PIPELINE_REDIS__URL``).
        prefix: their key prefix (``PIPELINE_REDIS__KEY_PREFIX``).
        specs: the declarations just applied.
        created: the topics the apply created (it did not find them on the broker).
    """
    anew = {spec.lane: spec for spec in specs if spec.name in created}
    if not anew:
        return []
    guarded = await _lanes_with_keys(redis, prefix, set(anew))
    return [_line(anew[lane], lane_tag(prefix, lane)) for lane in sorted(guarded)]


def _line(spec: TopicSpec, tag: str) -> str:
    """The warning for ``spec``'s lane, in the words of the guard's own (``_dropped_stale``)."""
    return (
        f"lane {spec.lane!r}: topic {spec.name} was just created while Redis still holds the"
        f" lane's guard keys ({tag}*), which remember finished messages by where they were first"
        " delivered (topic:partition:offset); the new topic gives those positions out again, so"
        " a retry copy of a new message at such a position would be taken for a late duplicate"
        f" and dropped: delete the lane's guard keys ({tag}*) while no member of the lane runs"
        f" (redis-cli --scan --pattern '{tag}*' | xargs -r redis-cli del)"
    )


async def _lanes_with_keys(redis: Redis, prefix: str, lanes: set[str]) -> set[str]:
    """Those of ``lanes`` having at least one key under their tag, in one scan of the keys.

    The keys are ``{P:guard:LANE}...`` (a prefix and lanes are identifiers: no glob characters);
    the scan stops once every lane is found.
    """
    start = f"{{{prefix}:guard:"
    found: set[str] = set()
    async for raw in redis.scan_iter(match=f"{start}*", count=_SCAN_COUNT):
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        lane = name[len(start) :].partition("}")[0]
        if lane in lanes:
            found.add(lane)
            if found == lanes:
                break
    return found
