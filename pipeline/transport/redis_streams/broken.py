"""A partition whose stream key is in a bad state, set aside so the member's others read on.

A member reads all its partitions with one ``XREADGROUP``; a single key in a bad state fails it
whole: a stream key another program overwrote with another type (``WRONGTYPE``), the group
destroyed on one stream (``NOGROUP``), the stream deleted or evicted. :func:`probe` finds which
of the partitions it is (one pipelined ``XINFO GROUPS`` each: Redis's reply names no key, or the
key of a blocked read that ended); the member revokes such a partition as lost, reads on without
it, and takes it up again on its own with backoff (:class:`Broken`): at once where it can make
the stream's group again itself, after the operator repaired the key otherwise. One line says
what failed, which key and what to do; its repeats carry a :data:`REPEAT_KEY` of the partition,
so :class:`~pipeline.log_repeats.RepeatFilter` backs them off.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline.envelope import TopicPartition
from pipeline.log_repeats import REPEAT_KEY
from pipeline.transport.redis_streams.errors import is_wrong_type, no_stream
from pipeline.transport.redis_streams.keys import Keys
from pipeline.transport.redis_streams.lost import vanished

__all__ = ["FIRST_RETRY_S", "MAX_RETRY_S", "Broken", "State", "per_key", "probe"]

State = Literal["wrong_type", "no_stream", "no_group"]
"""What is wrong with a partition's stream key."""
FIRST_RETRY_S = 0.5
"""Seconds before a partition the member cannot make good itself is tried again, at first."""
MAX_RETRY_S = 5.0
"""The longest wait between two tries of one such partition (its gap doubles up to this)."""


def per_key(error: rexc.ResponseError) -> bool:
    """Whether ``error`` of a read may come from one of its streams alone (probe to find which)."""
    return vanished(error) or is_wrong_type(str(error))


async def probe(
    client: Redis, keys: Keys, group: str | None, partitions: Collection[TopicPartition]
) -> dict[TopicPartition, State]:
    """The partitions of ``partitions`` whose stream key is in a bad state, and which state.

    One pipelined ``XINFO GROUPS`` per stream: a reply naming no group ``group`` is
    ``no_group`` (never with ``group`` None: a reader in no group), ``no such key`` is
    ``no_stream``, ``WRONGTYPE`` is ``wrong_type``.
    """
    ordered = sorted(partitions)
    if not ordered:
        return {}
    pipe = client.pipeline(transaction=False)
    for tp in ordered:
        pipe.xinfo_groups(keys.stream(tp.topic, tp.partition))
    replies: list[Any] = await pipe.execute(raise_on_error=False)
    found: dict[TopicPartition, State] = {}
    for tp, reply in zip(ordered, replies, strict=True):
        if isinstance(reply, rexc.ResponseError):
            if is_wrong_type(str(reply)):
                found[tp] = "wrong_type"
            elif "no such key" in str(reply):
                found[tp] = "no_stream"
            else:
                raise reply
        elif isinstance(reply, BaseException):
            raise reply
        elif group is not None and not any(_name(g["name"]) == group for g in reply):
            found[tp] = "no_group"
    return found


def _name(raw: str | bytes) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw


@dataclass
class Broken:
    """One partition set aside: what is wrong, and when it is tried again."""

    state: State
    next_at_s: float
    gap_s: float = FIRST_RETRY_S

    @classmethod
    def found(cls, state: State) -> Broken:
        """Just found: a missing stream or group is made again at once, a wrong type later."""
        now = time.monotonic()
        if state != "wrong_type":
            return cls(state, now)
        return cls(state, now + FIRST_RETRY_S, gap_s=2 * FIRST_RETRY_S)

    def due(self, now_s: float) -> bool:
        """Whether it is time to try the partition again."""
        return now_s >= self.next_at_s

    def failed_again(self, state: State) -> None:
        """The try failed (``state`` now): the next one waits twice as long, up to the most."""
        self.state = state
        self.next_at_s = time.monotonic() + self.gap_s
        self.gap_s = min(self.gap_s * 2, MAX_RETRY_S)


def repeat_key(group: str, tp: TopicPartition, broken: Broken) -> dict[str, object]:
    """The ``extra`` of a partition's line: its repeats in the same state are alike."""
    return {REPEAT_KEY: f"{broken.state} stream of {group} {tp.topic}[{tp.partition}]"}


def line(member: str, group: str, tp: TopicPartition, stream: str, broken: Broken) -> str:
    """What failed on ``tp``, its key ``stream``, what the member does and what to do."""
    where = f"{member} of {group}: partition {tp.topic}[{tp.partition}]"
    others = "its other partitions read on"
    if broken.state == "wrong_type":
        return (
            f"{where} is not read: its {no_stream(stream)}: the member then makes the stream again "
            f"and reads on from the group's committed position; {others}; this one is tried "
            f"again every {MAX_RETRY_S:g} s at most"
        )
    if broken.state == "no_group":
        return (
            f"{where}: group {group} is gone from its stream {stream!r} (NOGROUP: destroyed with "
            "`XGROUP DESTROY`?); the member makes it again and reads on from the group's "
            f"committed position; {others}"
        )
    return (
        f"{where}: its stream {stream!r} is gone (NOGROUP: deleted, or evicted by a "
        "maxmemory-policy other than noeviction), with the messages it held; the member makes it "
        f"again and reads on from the group's committed position; {others}"
    )
