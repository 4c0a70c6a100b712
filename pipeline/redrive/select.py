"""Which dead-lettered messages a redrive takes: filters on time, tenant, error, key."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class Selection:
    """Filters; a message is selected when it passes every one that is set."""

    since_ms: int | None = None
    until_ms: int | None = None
    tenant: str | None = None
    error_class: str | None = None
    key: str | None = None

    def matches(self, message: Message) -> bool:
        """True if ``message`` passes every filter."""
        if self.since_ms is not None and message.timestamp_ms < self.since_ms:
            return False
        if self.until_ms is not None and message.timestamp_ms >= self.until_ms:
            return False
        if self.tenant is not None and message.headers.get(h.TENANT) != self.tenant.encode():
            return False
        if self.error_class is not None and not error_class(message).endswith(self.error_class):
            return False
        return self.key is None or message.key == self.key.encode()

    def fingerprint(self) -> str:
        """A stable text of the filters (names the redrive's resumable position)."""
        return repr((self.since_ms, self.until_ms, self.tenant, self.error_class, self.key))
