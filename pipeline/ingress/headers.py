"""The headers every produced ingress event carries, and the function that fills them.

The names come from :mod:`pipeline.headers`. The consumer runtime reads ``pl-row-id`` to mark
the row processed (:meth:`pipeline.logstore.ProcessedMarker.mark_processed`) and
``pl-event-id`` for idempotency; ``pl-replay-count`` is 0 on the first production; a sweeper
replay sends the sweeper's replays since the first production or the last replay by hand, a
replay by hand the count before it plus one. ``traceparent`` is the W3C trace context the row
was stored with (:mod:`pipeline.tracing`), when it has one, and ``tracestate`` the provider's
vendor state that came with it, when it sent a valid one. ``pl-content-encoding`` is the
request's ``Content-Encoding``, when it had one: the ingress verifies, stores and produces the
body as the bytes sent, so a gzip body reaches the consumer compressed, and this says so.
"""

from __future__ import annotations

from pipeline import headers as names
from pipeline.logstore import LogRow, NewRow
from pipeline.offload.rows import reference_headers
from pipeline.tracing import TRACEPARENT, TRACESTATE

ROW_ID = names.ROW_ID
SOURCE = names.SOURCE
TENANT = names.TENANT
EVENT_ID = names.EVENT_ID
RECEIVED_AT_MS = names.RECEIVED_AT_MS
REPLAY_COUNT = names.REPLAY_COUNT
CONTENT_ENCODING = names.CONTENT_ENCODING
_REQUEST_ENCODING = "content-encoding"
"""The request header it is read from, which every source keeps in its rows."""

JOINED_REQUEST_HEADERS = frozenset({TRACEPARENT, TRACESTATE})
"""Request headers whose repeats are joined with ``,`` (HTTP's rule for a repeated field).

Elsewhere the last value is kept. Two ``traceparent`` values joined are no valid context (the
W3C rules: a new trace), and repeated ``tracestate`` values are one list, in order.
"""


def event_headers(row: NewRow | LogRow, replay_count: int = 0) -> dict[str, bytes]:
    """The headers of the event produced for ``row``."""
    out = {
        ROW_ID: row.id.encode(),
        SOURCE: row.source.encode(),
        TENANT: row.tenant.encode(),
        EVENT_ID: row.event_id.encode(),
        RECEIVED_AT_MS: str(row.received_at_ms).encode(),
        REPLAY_COUNT: str(replay_count).encode(),
        **reference_headers(row.headers),  # an offloaded body: the event is its reference
    }
    encoding = row.headers.get(_REQUEST_ENCODING)
    if encoding:
        out[CONTENT_ENCODING] = encoding.encode()
    context = row.headers.get(TRACEPARENT)
    if context:
        out[TRACEPARENT] = context.encode()
        state = row.headers.get(TRACESTATE)
        if state:
            out[TRACESTATE] = state.encode()
    return out


def event_key(row: NewRow | LogRow) -> bytes | None:
    """The partitioning key of the event produced for ``row`` (None when it has none)."""
    return row.key.encode() if row.key else None
