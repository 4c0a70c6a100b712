"""The connections one HTTP server holds open, their bound, and which one to evict first.

Each client connection holds a file descriptor. Without a bound, connections that send nothing
(or half a request) take every descriptor under the open-file limit, and the process's own
connections to its broker, Redis and database then fail. Both HTTP layers of the project bound
theirs with :class:`OpenConnections`: the ingress's webhook port
(:mod:`pipeline.ingress.http`, ``PIPELINE_INGRESS__MAX_CONNECTIONS``) and the metrics ports
(:mod:`pipeline.observability.metrics_http`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

LIMIT_LOG_EVERY_S = 10.0
"""At most one log line per this many seconds says connections past the bound were closed."""


class Evictable(Protocol):
    """A connection :class:`OpenConnections` can close to make room for a new one.

    ``admitted`` starts False and only :class:`OpenConnections` changes it: True from the
    connection's admission until it is lost or evicted, so a connection evicted, then lost,
    leaves the count once, whatever its protocol does when it closes.
    """

    admitted: bool

    def evict(self) -> None:
        """Close this connection now; it no longer counts under the bound (already unmarked)."""


C = TypeVar("C", bound=Evictable)


def _not_counted(outcome: str) -> None:
    del outcome


class OpenConnections(Generic[C]):
    """The connections one server holds open, their bound, and which one to evict first.

    ``stalled`` holds the open connections with no request being answered, the one that has
    sent nothing for the longest first: a connection leaves it while a request of its own is
    answered (:meth:`answering`) and comes back last (:meth:`answered`), and a read moves it
    last (:meth:`active`); one that was answered for good and only closes goes to ``closing``,
    evicted before any stalled one (:meth:`done`). The one evicted is then found in O(1),
    however many are answering, and a slow upload that keeps sending outlives the connections
    that stall, however many an attacker opens after it. Only these methods touch ``stalled``,
    ``closing`` and each connection's ``admitted``: a protocol tells what happened to its
    connection, never edits any.
    """

    __slots__ = (
        "bound",
        "clock",
        "closed",
        "closing",
        "count",
        "counted",
        "last_logged",
        "limit",
        "log",
        "refused",
        "stalled",
    )

    def __init__(
        self,
        limit: int | None,
        *,
        bound: str = "the bound",
        log: logging.Logger | None = None,
        counted: Callable[[str], None] = _not_counted,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """No connection yet; at most ``limit`` (None: no bound).

        ``bound`` names the bound in the log line (and the setting that changes it), written to
        ``log``; ``counted("closed")`` or ``counted("refused")`` is called for each connection
        closed to keep it.
        """
        self.limit = limit
        self.bound = bound
        self.log = log or logging.getLogger(__name__)
        self.counted = counted
        self.clock = clock
        self.count = 0  # connections admitted and not yet lost or evicted
        self.stalled: OrderedDict[C, None] = OrderedDict()
        self.closing: OrderedDict[C, None] = OrderedDict()  # answered for good (:meth:`done`)
        self.closed = 0  # stalled connections closed since the last log line
        self.refused = 0  # new connections closed at once since the last log line
        self.last_logged: float | None = None

    def admit(self, connection: C) -> bool:
        """Hold ``connection``, evicting a stalled one at the bound; False: refuse it."""
        limit = self.limit
        if limit is not None and self.count >= limit and not self._close_stalled():
            self.refused += 1
            self.counted("refused")
            self._report()
            return False
        self.count += 1
        connection.admitted = True
        self.stalled[connection] = None
        return True

    def leave(self, connection: C) -> None:
        """``connection`` is lost: it no longer counts (if refused or evicted, it did not)."""
        if connection.admitted:
            connection.admitted = False
            self.stalled.pop(connection, None)
            self.closing.pop(connection, None)
            self.count -= 1

    def active(self, connection: C) -> None:
        """``connection`` sent bytes: the last stalled one to evict."""
        stalled = self.stalled
        if connection in stalled:
            stalled.move_to_end(connection)

    def answering(self, connection: C) -> None:
        """A request of ``connection`` is being answered: it is not evicted until answered."""
        self.stalled.pop(connection, None)

    def answered(self, connection: C) -> None:
        """``connection``'s request is answered: the last one to evict, if it still counts."""
        if connection.admitted:
            self.stalled[connection] = None

    def done(self, connection: C) -> None:
        """``connection`` was answered for the last time and only closes: evicted first.

        Of such connections the oldest goes first (the newest is the likeliest to be still
        sending what it was refused for, and to read its answer only once sent); its eviction
        is neither counted nor logged as a stalled one's: it had its answer.
        """
        if connection.admitted:
            self.stalled.pop(connection, None)
            self.closing[connection] = None

    def _close_stalled(self) -> bool:
        """Evict a closing connection, else the one stalled the longest; whether there was one."""
        if self.closing:
            victim, _ = self.closing.popitem(last=False)
            self.count -= 1
            victim.admitted = False
            victim.evict()
            return True
        if not self.stalled:
            return False
        victim, _ = self.stalled.popitem(last=False)
        self.count -= 1
        victim.admitted = False
        victim.evict()
        self.closed += 1
        self.counted("closed")
        self._report()
        return True

    def _report(self) -> None:
        """One log line for what was closed since the last one, at most every few seconds."""
        now = self.clock()
        if self.last_logged is not None and now - self.last_logged < LIMIT_LOG_EVERY_S:
            return
        self.last_logged = now
        self.log.warning(
            "%d connections open, %s: %d stalled ones closed for new ones, %d new ones closed"
            " at once (every one answering), since the last such line",
            self.limit,
            self.bound,
            self.closed,
            self.refused,
        )
        self.closed = self.refused = 0
