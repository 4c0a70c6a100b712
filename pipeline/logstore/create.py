"""The log store the settings choose, for every process that opens one.

The ingress writes through it, ``pipeline consume --mark-processed`` marks rows processed and
``pipeline status`` reads the counts; all three build it here, below the stages that use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pipeline.config import IngressSettings, Settings
from pipeline.logstore.protocol import LogStore
from pipeline.logstore.sqlite import SqliteLogStore


def create_log_store(
    settings: Settings, ingress: IngressSettings, *, clock: Callable[[], float] = time.time
) -> LogStore:
    """The log store the settings choose (not yet opened)."""
    if ingress.log_store == "postgres":
        # Imported here: psycopg takes about 0.1 s to import, which every process that only
        # may open a log (a member without a PostgreSQL log, the CLI) would pay at start.
        from pipeline.logstore.postgres import PostgresLogStore  # noqa: PLC0415

        return PostgresLogStore(
            settings.postgres.url,
            schema=ingress.postgres_schema,
            connect_timeout_s=settings.postgres.connect_timeout_s,
            max_batch=ingress.group_commit_max_rows,
            clock=clock,
        )
    return SqliteLogStore(
        ingress.sqlite_path,
        synchronous=ingress.sqlite_synchronous,
        max_batch=ingress.group_commit_max_rows,
        clock=clock,
    )
