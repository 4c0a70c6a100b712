"""Retry-tier messages wait here for their due time, on one timer per partition, not on a task.

A retry tier's partition holds messages in due order (within the tier's jitter). When the head is
not due yet, it is held and one timer is set for its due time; when the timer fires, every
message now due is released in order. The partition keeps flowing while it holds fewer than
:data:`HOLD_AHEAD` messages, so the copies behind the head are already here when they fall due
(on Kafka a paused partition drops what the client fetched of it, and what it fetches again
after the resume arrives behind every other partition's read-ahead); past that it is paused,
and it resumes once it holds half as many. A message is never released before its due time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Generic

from pipeline import headers as h
from pipeline.envelope import TopicPartition
from pipeline.runtime.flow import PauseBook
from pipeline.runtime.work import Item, T

log = logging.getLogger(__name__)

HOLD_AHEAD = 64
"""Messages a retry tier's partition may hold waiting for their due time before it is paused."""


def due_ms(message: Item) -> int:
    """The message's due time in epoch milliseconds (0: due now)."""
    return h.int_header(message.headers, h.DUE_MS)


class DueGate(Generic[T]):
    """Holds messages of paused retry-tier partitions until they are due."""

    def __init__(self, pauses: PauseBook, release: Callable[[T], None]) -> None:
        """Release due messages through ``release``; pause and resume through ``pauses``."""
        self._pauses = pauses
        self._release = release
        self._held: dict[TopicPartition, deque[T]] = {}
        self._timers: dict[TopicPartition, asyncio.TimerHandle] = {}

    def offer(self, message: T) -> None:
        """Release ``message`` now if due and nothing is held before it; otherwise hold it."""
        held = self._held.get(message.tp)
        if held is None and due_ms(message) <= time.time() * 1000:
            self._release(message)
            return
        if held is None:
            held = self._held[message.tp] = deque()
            log.debug("holding %s until %d", message.tp, due_ms(message))
        held.append(message)
        if len(held) == HOLD_AHEAD:  # it grows one at a time, so it crosses the bound here
            self._pauses.pause(message.tp, "due")
        if message.tp not in self._timers:
            self._arm(message.tp)

    def _arm(self, tp: TopicPartition) -> None:
        head = self._held[tp][0]
        delay_s = max(0.0, due_ms(head) / 1000 - time.time())
        loop = asyncio.get_running_loop()
        self._timers[tp] = loop.call_later(delay_s, self._fire, tp)

    def _fire(self, tp: TopicPartition) -> None:
        self._timers.pop(tp, None)
        held = self._held.get(tp)
        if not held:
            return
        now_ms = time.time() * 1000
        while held and due_ms(held[0]) <= now_ms:
            self._release(held.popleft())
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
            timer = self._timers.pop(tp, None)
            if timer:
                timer.cancel()
            dropped += self._held.pop(tp, deque())
        return dropped
