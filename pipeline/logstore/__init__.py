"""Stage 2, the durable webhook log: the obligation lives here, the queue is only a fast path.

A row is written (and committed) before the ingress answers 2xx, then moves
``received -> produced -> processed``, or to ``abandoned`` after too many replays::

    received ──produce acked──▶ produced ──consumer handled──▶ processed
        ▲                          │
        └── sweeper produces       └── sweeper replays (patiently) ──▶ abandoned (CRITICAL)

:mod:`pipeline.logstore.protocol` holds the row types and the role protocols; one package per
technology implements them with the same file names: :mod:`pipeline.logstore.sqlite` (the
embedded default, WAL with group commit) and :mod:`pipeline.logstore.postgres` (psycopg 3 pool,
safe with several ingress replicas).
"""

from pipeline.logstore.errors import LogStoreError
from pipeline.logstore.protocol import (
    IngressLog,
    LogRow,
    LogStore,
    NewRow,
    ProcessedMarker,
    ReplayLog,
    RowState,
    Selection,
    SweepLog,
)

__all__ = [
    "IngressLog",
    "LogRow",
    "LogStore",
    "LogStoreError",
    "NewRow",
    "ProcessedMarker",
    "ReplayLog",
    "RowState",
    "Selection",
    "SweepLog",
]
