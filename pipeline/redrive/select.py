"""Which dead-lettered messages a redrive takes: filters on time, tenant, error, key."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import datetime

from pipeline import headers as h
from pipeline.envelope import Message

_RELATIVE = re.compile(r"^(\d+)(s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3_600, "d": 86_400}


def parse_time_ms(text: str, *, now_s: float | None = None) -> int:
    """Epoch milliseconds of an ISO 8601 time or of an age (that long ago).

    Examples: ``2026-11-29T10:00:00+00:00``, ``90m``, ``2h``, ``7d``.

    Raises:
        ValueError: neither form.
    """
    match = _RELATIVE.match(text.strip())
    if match:
        now = time.time() if now_s is None else now_s
        return int((now - int(match.group(1)) * _UNIT_S[match.group(2)]) * 1000)
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"expected an ISO 8601 time or an age like 90m, 2h, 7d (got {text!r})"
        ) from None
    if stamp.tzinfo is None:
        raise ValueError(f"give the time zone, e.g. {text}+00:00 (got {text!r})")
    return int(stamp.timestamp() * 1000)


def error_class(message: Message) -> str:
    """The dead letter's error class (``?`` if none was recorded)."""
    return message.headers.get(h.ERROR_CLASS, b"?").decode(errors="replace")


def reason(message: Message) -> str:
    """The dead letter's reason and error class, as the dry run's histogram groups them."""
    why = message.headers.get(h.DEAD_REASON, b"?").decode(errors="replace")
    return f"{why}: {error_class(message)}"


def _typed_bytes(text: str) -> bytes:
    """The bytes of a filter as typed: UTF-8, and bytes that are not UTF-8 as they came.

    Python hands command-line bytes that are not UTF-8 over as lone surrogates
    (``surrogateescape``); they are turned back into those bytes, so a binary key matches.
    """
    return text.encode(errors="surrogateescape")


@dataclass(frozen=True, slots=True)
class Selection:
    """Filters; a message is selected when it passes every one that is set."""

    since_ms: int | None = None
    until_ms: int | None = None
    tenant: str | None = None
    error_class: str | None = None
    key: str | None = None
    typed: str | None = field(default=None, compare=False)
    """The filters as the operator typed them (``--since 2h``), when built by :meth:`typed_as`."""

    @classmethod
    def typed_as(
        cls,
        *,
        since: str | None = None,
        until: str | None = None,
        tenant: str | None = None,
        error_class: str | None = None,
        key: str | None = None,
        now_s: float | None = None,
    ) -> Selection:
        """The selection of command-line filters; times may be ages (``2h``) or ISO times.

        The fingerprint is the text typed, not the times it resolves to now, so the same
        command run again resumes the same redrive instead of starting over.

        Raises:
            ValueError: a time is neither an ISO 8601 time nor an age.
        """
        return cls(
            since_ms=parse_time_ms(since, now_s=now_s) if since else None,
            until_ms=parse_time_ms(until, now_s=now_s) if until else None,
            tenant=tenant,
            error_class=error_class,
            key=key,
            typed=repr((since, until, tenant, error_class, key)),
        )

    def matches(self, message: Message) -> bool:
        """True if ``message`` passes every filter."""
        if self.since_ms is not None and message.timestamp_ms < self.since_ms:
            return False
        if self.until_ms is not None and message.timestamp_ms >= self.until_ms:
            return False
        if self.tenant is not None and message.headers.get(h.TENANT) != _typed_bytes(self.tenant):
            return False
        if self.error_class is not None and not error_class(message).endswith(self.error_class):
            return False
        return self.key is None or message.key == _typed_bytes(self.key)

    def fingerprint(self) -> str:
        """A stable text of the filters (names the redrive's resumable position)."""
        if self.typed is not None:
            return "typed:" + self.typed
        return repr((self.since_ms, self.until_ms, self.tenant, self.error_class, self.key))
