"""Helpers shared by the log store and ingress tests."""

from __future__ import annotations

from pipeline.logstore import NewRow


class FakeClock:
    """Seconds since the epoch that move only when a test says so."""

    def __init__(self, start_s: float = 1_800_000_000.0) -> None:
        """Start at ``start_s``."""
        self.now_s = start_s

    def __call__(self) -> float:
        """The current time in seconds."""
        return self.now_s

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.now_s += seconds

    @property
    def now_ms(self) -> int:
        """The current time in milliseconds."""
        return int(self.now_s * 1000)


def new_row(n: int, clock: FakeClock, **fields: object) -> NewRow:
    """A row numbered ``n`` received now; ``fields`` override any attribute."""
    values: dict[str, object] = {
        "id": f"{clock.now_ms:013x}{n:08x}",
        "source": "meta",
        "tenant": "t1",
        "key": f"k{n % 3}",
        "topic": "messages",
        "lane": "messages",
        "event_id": f"ev-{n}",
        "received_at_ms": clock.now_ms,
        "headers": {"x-hub-signature-256": "sha256=00"},
        "body": b'{"n": %d}' % n,
    }
    values.update(fields)
    return NewRow(**values)  # type: ignore[arg-type]
