"""When to shed work: a lane's deadline and its CoDel-style standing-queue detector.

A message expires when it is past its deadline: the earliest of the ``pl-deadline-ms`` header
and the lane's ``max_age`` counted from when the message became due (its produce time, or its
retry's due time). Expired work is never handled late; it is dropped or dead-lettered.

:class:`StandingQueue` follows CoDel (Nichols and Jacobson, "Controlling Queue Delay"): a queue
that is merely busy drains within an interval, so some message starts within the target; a
queue whose *minimum* waiting time stays above the target for a whole interval is standing, and
serves no one well. While it stands, only messages that waited briefly are started; the others
are shed until waiting falls below the target again. This is what lets a lane recover after a
spike instead of working through a backlog no client still waits for.
"""

from __future__ import annotations

from pipeline import headers as h
from pipeline.envelope import Message
from pipeline.topics.spec import SojournPolicy, TopicSpec


def due_since_ms(message: Message) -> int:
    """When ``message`` became due: its retry's due time, else its produce time (ms).

    Only a copy read from a retry tier has a due time: a ``pl-due-ms`` on a main topic (any
    producer can write one) would otherwise push its ``max_age`` deadline, and the waiting time
    the standing queue judges, as far ahead as it says.
    """
    if h.DUE_MS in message.headers and h.retry_tier(message.topic):
        return h.int_header(message.headers, h.DUE_MS) or message.timestamp_ms
    return message.timestamp_ms


def deadline_ms(message: Message, spec: TopicSpec) -> int | None:
    """The message's deadline in ms since the epoch, or None if it has none."""
    header = h.int_header(message.headers, h.DEADLINE_MS) or None
    if spec.max_age_ms is None:
        return header
    by_age = due_since_ms(message) + spec.max_age_ms
    return by_age if header is None else min(header, by_age)


class StandingQueue:
    """CoDel's standing-queue test over the waiting times of one lane's started messages."""

    def __init__(self, policy: SojournPolicy) -> None:
        """Start in the good state: nothing has waited yet."""
        self._target_ms = policy.target_ms
        self._interval_ms = policy.interval_ms
        self._brief_ms = policy.brief_ms
        self._above_since_ms: int | None = None
        self.standing = False
        self.shed = 0

    def admit(self, waited_ms: int, now_ms: int) -> bool:
        """Record a message about to start after waiting ``waited_ms``; False means shed it."""
        if waited_ms < self._target_ms:
            self._above_since_ms = None
            self.standing = False
            return True
        if self._above_since_ms is None:
            self._above_since_ms = now_ms
        elif now_ms - self._above_since_ms >= self._interval_ms:
            self.standing = True
        if self.standing and waited_ms > self._brief_ms:
            self.shed += 1
            return False
        return True
