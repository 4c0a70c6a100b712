"""librdkafka's log lines of one consumer, passed on, with its session timeouts noted.

With static membership, a consumer whose session timed out (the broker unreachable or paused
past ``session.timeout.ms``) rejoins under its ``group.instance.id`` at once, while a request
of its old session may still be answered: the broker then fences the old member id, and
librdkafka reports the consumer fenced by "another consumer" with its own name, as a fatal
error (confluentinc/librdkafka#3437). A name clash between two live members is fenced without
a session timeout before it. The consumer tells the two apart by the time of its last
``SESSTMOUT`` line.
"""

from __future__ import annotations

import logging
import math
import time

SESSION_TIMED_OUT = "SESSTMOUT"
"""librdkafka's facility for "Consumer group session timed out ... rejoining group"."""


class SessionLog:
    """The ``logger`` of one consumer: every line goes to ``target``; session timeouts are kept.

    librdkafka calls ``log(level, "%s [%s] %s", facility, client name, text)``.
    """

    __slots__ = ("session_lost_at", "target")

    def __init__(self, target: logging.Logger) -> None:
        """Pass lines on to ``target``; no session lost yet."""
        self.target = target
        self.session_lost_at = -math.inf
        """When (monotonic s) this consumer last logged that its session timed out."""

    def log(self, level: int, msg: str, *args: object) -> None:
        """One librdkafka log line."""
        if args and args[0] == SESSION_TIMED_OUT:
            self.session_lost_at = time.monotonic()
        self.target.log(level, msg, *args)

    def lost_session_within(self, seconds: float) -> bool:
        """Whether the session timed out in the last ``seconds``; forgets it once asked."""
        lost = time.monotonic() - self.session_lost_at <= seconds
        if lost:
            self.session_lost_at = -math.inf
        return lost
