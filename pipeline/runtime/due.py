"""Retry-tier messages wait here for their due time, on one timer per partition, not on a task.

A retry tier's partition holds messages nearly in due order: each copy's delay is jittered, so a
copy can fall due before one written ahead of it. Each is released at its own due time, earliest
first, and never waits for a copy ahead of it that is due later (on an ordered lane a key has at
most one copy in the tiers, its parked head, so nothing of one key is reordered; the partition's
commits follow the lowest unfinished offset as everywhere). One timer per partition is set for
the earliest due time held. The partition keeps flowing while it holds fewer than
:data:`HOLD_AHEAD` messages, so the copies behind are already here when they fall due (on Kafka
a paused partition drops what the client fetched of it, and what it fetches again after the
resume arrives behind every other partition's read-ahead); past that it is paused, and it
resumes once it holds half as many. A message is never released before its due time, unless
that time is further ahead than its lane's longest tier (written by some other producer): it then
waits that tier's delay.

Due times are judged by the gate's clock: in a member with Redis the
:class:`~pipeline.runtime.shared_clock.SharedClock`, Redis's clock, which the retry router
stamped them with on whichever member failed the message; so hosts whose clocks disagree do not
run a copy early or late by the difference. A timer waits the due time less that clock's now.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable
from typing import Generic

from pipeline import headers as h
from pipeline.envelope import TopicPartition
from pipeline.runtime.flow import PauseBook
from pipeline.runtime.shared_clock import local_ms
from pipeline.runtime.work import Item, T

log = logging.getLogger(__name__)

HOLD_AHEAD = 64
"""Messages a retry tier's partition may hold waiting for their due time before it is paused."""


def due_ms(message: Item) -> int:
    """The message's due time in epoch milliseconds (0: due now, or no retry copy).

    Only a copy read from a retry tier has one: on a main topic ``pl-due-ms`` means nothing
    (:func:`~pipeline.headers.retry_tier`).
    """
    return h.int_header(message.headers, h.DUE_MS) if h.retry_tier(message.tp.topic) else 0


class DueGate(Generic[T]):
    """Holds messages of retry-tier partitions until they are due, earliest due first."""

    def __init__(
        self,
        pauses: PauseBook,
        release: Callable[[T], None],
        clock_ms: Callable[[], int] = local_ms,
    ) -> None:
        """Release due messages through ``release``; pause and resume through ``pauses``.

        ``clock_ms``: now in ms since the epoch, the clock due times were written with.
        """
        self._pauses = pauses
        self._release = release
        self._clock_ms = clock_ms
        self._held: dict[TopicPartition, list[tuple[int, int, T]]] = {}
        """Per partition, a heap of (due ms, arrival, message): equal due times in arrival order."""
        self._timers: dict[TopicPartition, tuple[int, asyncio.TimerHandle]] = {}
        """Per partition, the due time its timer is set for, and the timer."""
        self._arrivals = itertools.count()

    def offer(self, message: T, longest_ms: int | None = None) -> None:
        """Release ``message`` now if it is due; otherwise hold it until it is.

        ``longest_ms``: the longest delay its lane's tiers give a copy. Any producer can write
        ``pl-due-ms``: a due time further ahead than that is held only that long, so that it
        cannot hold its partition's committed position for years.
        """
        due = due_ms(message)
        raw = message.headers.get(h.DUE_MS)
        if due == 0 and raw is not None and h.parse_int(raw) is None:
            log.warning(  # the line shows no garbage, which differs per message: repeats back off
                "%s of %s@%d is no time in ms since the epoch (ASCII decimal within 64 bits):"
                " it is due now",
                h.DUE_MS,
                message.tp,
                message.offset,
            )
        now_ms = self._clock_ms()
        if due <= now_ms:
            self._release(message)
            return
        if longest_ms is not None:
            due = min(due, now_ms + longest_ms)
        tp = message.tp
        held = self._held.get(tp)
        if held is None:
            held = self._held[tp] = []
            log.debug("holding %s until %d", tp, due)
        heapq.heappush(held, (due, next(self._arrivals), message))
        if len(held) == HOLD_AHEAD:  # it grows one at a time, so it crosses the bound here
            self._pauses.pause(tp, "due")
        armed = self._timers.get(tp)
        if armed is None or due < armed[0]:  # the earliest held is now this one
            if armed is not None:
                armed[1].cancel()
            self._arm(tp)

    def _arm(self, tp: TopicPartition) -> None:
        due = self._held[tp][0][0]
        delay_s = max(0.0, (due - self._clock_ms()) / 1000)
        loop = asyncio.get_running_loop()
        self._timers[tp] = (due, loop.call_later(delay_s, self._fire, tp))

    def _fire(self, tp: TopicPartition) -> None:
        self._timers.pop(tp, None)
        held = self._held.get(tp)
        if not held:
            return
        now_ms = self._clock_ms()
        while held and held[0][0] <= now_ms:
            self._release(heapq.heappop(held)[2])
        if held:
            self._arm(tp)
        else:
            del self._held[tp]
            log.debug("released %s", tp)
        if len(held) <= HOLD_AHEAD // 2:
            self._pauses.resume(tp, "due")  # nothing unless this gate paused it

    def drop(self, tps: set[TopicPartition]) -> list[T]:
        """Forget what is held for these partitions (they left this member); returns it."""
        dropped: list[T] = []
        for tp in tps:
            armed = self._timers.pop(tp, None)
            if armed:
                armed[1].cancel()
            held = sorted(self._held.pop(tp, []), key=lambda entry: entry[1])  # as they came
            dropped += [message for _, _, message in held]
        return dropped
