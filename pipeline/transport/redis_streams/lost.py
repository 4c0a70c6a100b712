"""A member's topics gone under it: deleted, or gone with all others in a Redis that lost its data.

A read finds its stream's group gone (``NOGROUP``), or its stream deleted under a blocked read
(``UNBLOCKED``), when a topic was deleted (and perhaps created again), and when the Redis lost
its data: restarted without persistence, flushed, failed over to a replica without it. The
topics then went with every other of the key prefix, the topics hash ``P:topics`` with them,
and the group's positions and the held followers and buffers in that Redis too. A deleted topic
is :class:`~pipeline.errors.UnknownTopic` as on Kafka; so is a Redis that lost its data (no
topic is left to read, and nothing tells where the group stood), with a line that says so and
what to do instead of asking to declare a topic that was declared.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline.errors import UnknownTopic
from pipeline.reachability import safe_url
from pipeline.transport.redis_streams.keys import Keys

__all__ = ["RUNBOOK", "lost_or_deleted", "vanished"]

RUNBOOK = "docs/operations.md#redis-or-kafka-outage"
"""Where the line sends the operator."""


def vanished(error: rexc.ResponseError) -> bool:
    """Whether ``error`` of a read says its stream or the group on it is gone."""
    text = str(error)
    return text.startswith(("NOGROUP", "UNBLOCKED the stream key no longer exists"))


def lost_line(url: str, keys: Keys, group: str, topics: Sequence[str]) -> str:
    """The line for ``topics`` of ``group`` gone with every topic of the Redis at ``url``."""
    return (
        f"topics {', '.join(topics)} are gone from Redis {safe_url(url)}, with every other"
        f" topic of key prefix {keys.prefix} (the hash {keys.topics} is gone): that Redis lost"
        " its data (restarted without persistence, flushed, or failed over to a replica"
        " without it), and with it the messages in those topics, group"
        f" {group}'s positions and the held followers and buffered messages it kept, unless"
        " every topic was deleted. Run `pipeline topics apply`, then start the members again:"
        " they read the topics from their first offset. The lost messages that came through"
        " the ingress are in its log (pipeline replay; with"
        " PIPELINE_RUNTIME__MARK_PROCESSED=true its sweeper replays them), nothing else has"
        f" the others; see {RUNBOOK}. Run that Redis with appendonly yes and appendfsync"
        " everysec."
    )


async def lost_or_deleted(
    client: Redis, keys: Keys, url: str, group: str, topics: Sequence[str], missing: UnknownTopic
) -> UnknownTopic:
    """The error for a topic of ``topics`` found ``missing`` after a read found it gone.

    ``missing`` itself when the topics hash is still there (the topic was deleted) or cannot be
    read; else one naming the loss of the Redis at ``url`` (:func:`lost_line`). One ``EXISTS``.
    """
    try:
        if await client.exists(keys.topics):
            return missing
    except rexc.RedisError:
        return missing
    return UnknownTopic(lost_line(url, keys, group, topics))
