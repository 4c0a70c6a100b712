"""Tell, while a member runs, that its Redis lost its data: held followers and buffers with it.

A follower held behind a parked key (an ordered lane with retry tiers) and a message waiting in
a debounce buffer have their offsets committed: Redis keeps their only copy. A Redis that comes
back empty (restarted without persistence, flushed, failed over to a replica that lagged)
loses them, and nothing else would say so: they simply never run.

The member writes a marker under its key prefix, without expiry, at start (``SET NX`` of a
random epoch; a marker already there, another member's, is adopted), and reads it back every
:data:`CHECK_INTERVAL_S` (one ``GET``; never per message). Gone or changed, the Redis lost its
data since the last look: one CRITICAL line (what was lost, where its messages are, what to
do), ``pipeline_redis_state_lost_total`` counted once, and the marker written again. Every
member using that Redis sees the same loss once: one line and one count per member, each
naming its own group. A Redis out of reach is skipped (the runtime says so on its calls).
A marker missing at start cannot be told from a first start: nothing is said then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Sequence
from typing import Protocol

from redis.asyncio import Redis

from pipeline.observability.metrics import REDIS_STATE_LOST, Metrics
from pipeline.reachability import safe_url
from pipeline.redis_functions import FAILED
from pipeline.runtime.app import Lane
from pipeline.runtime.eviction import buffering_lanes, holding_lanes, kept_only_in_redis

__all__ = ["CHECK_INTERVAL_S", "RUNBOOK", "LossCounter", "StateLostCounter", "StateWatch"]

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 5.0
"""Seconds between two reads of the marker: one Redis call each."""
RUNBOOK = "docs/operations.md#redis-or-kafka-outage"
"""Where the CRITICAL line sends the operator."""


def marker_key(prefix: str) -> str:
    """The marker of the data of the Redis the members of key prefix ``prefix`` use."""
    return f"{prefix}:state-epoch"


class LossCounter(Protocol):
    """Where a loss is counted (:class:`StateLostCounter`)."""

    def lost(self) -> None:
        """Count one loss."""
        ...


class StateLostCounter:
    """``pipeline_redis_state_lost_total`` of one group, shown (0) from the member's start."""

    def __init__(self, metrics: Metrics, group: str) -> None:
        """Count into ``metrics``; the group's sample exists from now on."""
        self._counter = metrics.counter(REDIS_STATE_LOST).labels(group=group)

    def lost(self) -> None:
        """Count one loss."""
        self._counter.inc()


def _topics(lanes: Sequence[Lane]) -> str:
    return ", ".join(lane.spec.name for lane in lanes)


def lost_line(url: str, group: str, lanes: Sequence[Lane], how: str) -> str:
    """The CRITICAL line for a loss found by the member of ``group`` on ``lanes``."""
    lost = " and ".join(kept_only_in_redis(lanes))
    topics = ", ".join(
        f"{what}: {_topics(chosen)}"
        for what, chosen in (("held", holding_lanes(lanes)), ("buffered", buffering_lanes(lanes)))
        if chosen
    )
    return (
        f"Redis {safe_url(url)} lost its data ({how}: restarted without persistence, flushed, "
        f"or failed over to a replica that lagged): the {lost} it had are gone and will not "
        f"run. Group {group} committed their offsets, so they are still in their topics "
        f"({topics}) below the group's positions, but nothing tells which: find them there, or "
        f"in the ingress log (pipeline replay); see {RUNBOOK}. Run that Redis with appendonly "
        "yes and appendfsync everysec. Every member using this Redis reports this once."
    )


class StateWatch:
    """The marker of one member's Redis: written at :meth:`start`, read by :meth:`check`."""

    def __init__(
        self,
        redis: Redis,
        url: str,
        prefix: str,
        group: str,
        lanes: Sequence[Lane],
        counter: LossCounter | None = None,
        *,
        interval_s: float = CHECK_INTERVAL_S,
    ) -> None:
        """Watch the Redis at ``url`` (``redis``) for the member of ``group`` running ``lanes``."""
        self._redis = redis
        self._url = url
        self._key = marker_key(prefix)
        self.group = group
        """The member's consumer group, named in the CRITICAL line."""
        self._lanes = list(lanes)
        self.counter = counter
        """Where a loss is counted (None: nowhere; set once the member's metrics exist)."""
        self._interval_s = interval_s
        self._epoch: bytes | None = None
        """The marker's value as last seen; None until it could be read or written."""

    @property
    def key(self) -> str:
        """The marker's key."""
        return self._key

    async def start(self) -> None:
        """Write the marker unless it is there (another member's: adopted). Quiet on failure."""
        with contextlib.suppress(*FAILED):
            self._epoch = await self._mark()

    async def _mark(self) -> bytes | None:
        """Write a new epoch if no marker is there; the marker's value now (None: none read)."""
        epoch = secrets.token_hex(8).encode()
        if await self._redis.set(self._key, epoch, nx=True):
            return epoch
        value = await self._redis.get(self._key)  # another member's, written first
        return value if isinstance(value, bytes) else None

    async def check(self) -> bool:
        """Read the marker once; True if the Redis lost its data since the last read.

        A loss is logged (CRITICAL), counted, and the marker written again (one call more).
        """
        try:
            value = await self._redis.get(self._key)
        except FAILED as exc:
            url = safe_url(self._url)
            log.debug("could not read the marker %s of Redis %s: %s", self._key, url, exc)
            return False
        if self._epoch is None or value == self._epoch:
            if value is None:  # never written (Redis was out of reach at start): write it now
                with contextlib.suppress(*FAILED):
                    self._epoch = await self._mark()
            else:
                self._epoch = value if isinstance(value, bytes) else None
            return False
        how = f"marker {self._key} {'gone' if value is None else 'changed'}"
        log.critical(lost_line(self._url, self.group, self._lanes, how))
        if self.counter is not None:
            self.counter.lost()
        if value is None:
            try:
                self._epoch = await self._mark()
            except FAILED:
                self._epoch = None  # written again at the next check
        else:  # another member saw the loss first and wrote it again
            self._epoch = value if isinstance(value, bytes) else None
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """:meth:`check` every interval until ``stop`` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)
            if not stop.is_set():
                await self.check()
