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
from typing import Any

SESSION_TIMED_OUT = "SESSTMOUT"
"""librdkafka's facility for "Consumer group session timed out ... rejoining group"."""
_WARNING = 4
"""syslog's (and librdkafka's ``log_level``) warning level."""


class SessionLog:
    """The ``logger`` of one consumer: every line goes to ``target``; session timeouts are kept.

    librdkafka calls ``log(level, "%s [%s] %s", facility, client name, text)``.
    """

    __slots__ = ("passed_from", "session_lost_at", "target")

    def __init__(self, target: logging.Logger) -> None:
        """Pass lines on to ``target``; no session lost yet."""
        self.target = target
        self.session_lost_at = -math.inf
        """When (monotonic s) this consumer last logged that its session timed out."""
        self.passed_from = logging.NOTSET
        """The least level of the lines passed on (the user's ``log_level``, see :func:`heard`)."""

    def log(self, level: int, msg: str, *args: object) -> None:
        """One librdkafka log line."""
        if args and args[0] == SESSION_TIMED_OUT:
            self.session_lost_at = time.monotonic()
        if level >= self.passed_from:
            self.target.log(level, msg, *args)

    def heard(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with librdkafka's warnings kept, whatever ``log_level`` the user chose.

        The consumer reads librdkafka's warnings (:data:`SESSION_TIMED_OUT`, offset resets:
        records lost to retention); a ``log_level`` below 4 (syslog's warning) would silence
        them. librdkafka is then given 4, and only the lines the user's level lets through are
        passed on.
        """
        try:
            chosen = int(config.get("log_level", _WARNING))
        except (TypeError, ValueError):  # librdkafka refuses it when the client is built
            return config
        if chosen >= _WARNING:
            return config
        self.passed_from = logging.ERROR if chosen == _WARNING - 1 else logging.CRITICAL
        return {**config, "log_level": _WARNING}

    def lost_session_within(self, seconds: float) -> bool:
        """Whether the session timed out in the last ``seconds``; forgets it once asked."""
        lost = time.monotonic() - self.session_lost_at <= seconds
        if lost:
            self.session_lost_at = -math.inf
        return lost
