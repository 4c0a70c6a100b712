"""Names of the headers every produced ingress event carries, and the function that fills them.

The consumer runtime reads ``row-id`` to mark the row processed
(:meth:`pipeline.logstore.ProcessedMarker.mark_processed`) and ``event-id`` for idempotency;
``replay-count`` is 0 on the first production and counts sweeper and CLI replays after it.
"""

from __future__ import annotations

from pipeline.logstore import LogRow, NewRow

ROW_ID = "row-id"
SOURCE = "source"
TENANT = "tenant"
EVENT_ID = "event-id"
RECEIVED_AT_MS = "received-at-ms"
REPLAY_COUNT = "replay-count"


def event_headers(row: NewRow | LogRow, replay_count: int = 0) -> dict[str, bytes]:
    """The headers of the event produced for ``row``."""
    return {
        ROW_ID: row.id.encode(),
        SOURCE: row.source.encode(),
        TENANT: row.tenant.encode(),
        EVENT_ID: row.event_id.encode(),
        RECEIVED_AT_MS: str(row.received_at_ms).encode(),
        REPLAY_COUNT: str(replay_count).encode(),
    }


def event_key(row: NewRow | LogRow) -> bytes | None:
    """The partitioning key of the event produced for ``row`` (None when it has none)."""
    return row.key.encode() if row.key else None
