"""What a cancellation covers, and whether a message is covered: pure, no I/O.

A :class:`Target` names the work: one event (by its event id, wherever and whenever it comes
up), or every message of a key or of a tenant that exists at the moment of the cancellation
(work that first exists after that millisecond is new work and runs), optionally on one lane
only. :class:`Selectors` is a member's copy of the standing cancellations, brought up to date
from Redis when their version changes (:meth:`~pipeline.cancel.functions.CancelFunctions.selectors`
reads only what changed), and answers for a message in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline import headers as h
from pipeline.envelope import Message
from pipeline.errors import ConfigError

Kind = Literal["event", "key", "tenant"]
ABANDONED = "abandoned"
"""The reason of work whose ``pl-abandon-after-ms`` passed."""
HUNG = "hung"
"""The reason of a run silent past its lane's heartbeat timeout (retried, not cancelled)."""


@dataclass(frozen=True, slots=True)
class Target:
    """Which work a cancellation covers.

    Attributes:
        kind: ``event`` (an event id), ``key`` (a message key) or ``tenant``.
        value: the event id, key or tenant.
        lane: only this lane; None for every lane.
    """

    kind: Kind
    value: str
    lane: str | None = None

    @classmethod
    def of(
        cls,
        *,
        event: str | None = None,
        key: str | None = None,
        tenant: str | None = None,
        lane: str | None = None,
    ) -> Target:
        """The target of exactly one of ``event``, ``key`` or ``tenant``."""
        given = [(k, v) for k, v in (("event", event), ("key", key), ("tenant", tenant)) if v]
        if len(given) != 1:
            raise ConfigError("name exactly one of an event id, a key or a tenant to cancel")
        kind, value = given[0]
        return cls(kind, value, lane)  # type: ignore[arg-type] # one of the three literals

    @property
    def field(self) -> str:
        """How Redis stores it: ``kind:lane:value`` (lane ``*`` for every lane)."""
        return f"{self.kind}:{self.lane or '*'}:{self.value}"

    def __str__(self) -> str:
        """``key K`` or ``tenant T on lane L``, for logs."""
        where = f" on lane {self.lane}" if self.lane else ""
        return f"{self.kind} {self.value}{where}"


@dataclass(frozen=True, slots=True)
class Facts:
    """What a cancellation can match in a message."""

    event: str | None
    key: str | None
    tenant: str | None
    origin_ms: int
    """When the work first existed: the earliest of its production (a retry copy's
    ``pl-produced-at-ms``), ingress and, lacking that header, first failure."""
    abandon_ms: int
    """``pl-abandon-after-ms``: after it no one waits for the result (0: never)."""


def _text(raw: bytes | None) -> str | None:
    return raw.decode(errors="replace") if raw else None


def facts_of(message: Message, fallback_event: str) -> Facts:
    """The facts of ``message``; ``fallback_event`` identifies it when it has no event id."""
    headers = message.headers
    times = [message.timestamp_ms]
    names = [h.RECEIVED_AT_MS, h.FIRST_FAILURE_MS]
    produced_ms = h.int_header(headers, h.PRODUCED_AT_MS)
    if 0 < produced_ms <= message.timestamp_ms:
        # A retry copy: its first delivery's time. Its first failure's is left out, taken on the
        # failing member's clock, which may lag; a value later than the copy itself is ignored.
        times = [produced_ms]
        names.remove(h.FIRST_FAILURE_MS)
    for name in names:
        value = h.int_header(headers, name)
        if value > 0:
            times.append(value)
    return Facts(
        event=_text(headers.get(h.EVENT_ID)) or fallback_event,
        key=_text(message.key),
        tenant=_text(headers.get(h.TENANT)),
        origin_ms=min(times),
        abandon_ms=h.int_header(headers, h.ABANDON_AFTER_MS),
    )


class Selectors:
    """A member's copy of the standing cancellations (``kind:lane:value`` -> at, reason)."""

    def __init__(
        self, version: int = 0, entries: dict[str, dict[str, object]] | None = None
    ) -> None:
        """Hold ``entries`` as read at ``version``."""
        self.version = version
        self._entries = entries or {}

    def __len__(self) -> int:
        """How many cancellations stand."""
        return len(self._entries)

    def __bool__(self) -> bool:
        """Whether any cancellation stands."""
        return bool(self._entries)

    def reason(self, lane: str, facts: Facts, now_ms: int) -> str | None:
        """Why work of ``lane`` with ``facts`` is cancelled, or None if it is not."""
        if 0 < facts.abandon_ms <= now_ms:
            return ABANDONED
        if not self._entries:
            return None
        for scope in ("*", lane):
            for kind, value in (
                ("event", facts.event),
                ("key", facts.key),
                ("tenant", facts.tenant),
            ):
                if value is None:
                    continue
                entry = self._entries.get(f"{kind}:{scope}:{value}")
                if entry is None or int(str(entry.get("until") or 0)) < now_ms:
                    continue  # none, or past its keep time (pruned at the next transition)
                at = int(str(entry.get("at", 0)))
                if kind == "event" or facts.origin_ms <= at:
                    return str(entry.get("reason") or "cancelled")
        return None
