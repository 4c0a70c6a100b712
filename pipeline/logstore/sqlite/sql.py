"""Every SQL statement of the SQLite log store, and the builder for selection filters.

One table, ``ingress_log``. Times are integers of milliseconds since the epoch; ``headers`` is a
JSON object; ``lease_until_ms`` is the claim lease of the sweeper (0 when unclaimed). The two
partial indexes serve the sweeper's two claims and stay small: only rows still owed are in them.
A third, of the processed rows' lanes (:data:`CREATE_PROCESSED`, not in :data:`SCHEMA`: built at
open only on a new or small table), answers :data:`HAS_PROCESSED` in one probe, where the table
would be scanned whole for a lane none of whose rows was ever marked.
"""

from __future__ import annotations

from pipeline.logstore.protocol import Selection

PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA busy_timeout=10000",
    "PRAGMA foreign_keys=OFF",
)
"""Applied to every connection; ``synchronous`` is set from the store's durability setting."""

SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS ingress_log (
        id               TEXT PRIMARY KEY,
        source           TEXT NOT NULL,
        tenant           TEXT NOT NULL,
        key              TEXT NOT NULL,
        topic            TEXT NOT NULL,
        lane             TEXT NOT NULL,
        event_id         TEXT NOT NULL,
        received_at_ms   INTEGER NOT NULL,
        headers          TEXT NOT NULL,
        body             BLOB NOT NULL,
        state            TEXT NOT NULL DEFAULT 'received',
        produce_attempts INTEGER NOT NULL DEFAULT 0,
        replay_count     INTEGER NOT NULL DEFAULT 0,
        last_error       TEXT NOT NULL DEFAULT '',
        produced_at_ms   INTEGER,
        lease_until_ms   INTEGER NOT NULL DEFAULT 0,
        UNIQUE (source, event_id)
    )
    """,
    """
    CREATE INDEX IF NOT EXISTS ingress_log_unproduced
        ON ingress_log (received_at_ms) WHERE state = 'received'
    """,
    """
    CREATE INDEX IF NOT EXISTS ingress_log_unprocessed
        ON ingress_log (produced_at_ms) WHERE state = 'produced'
    """,
    "CREATE INDEX IF NOT EXISTS ingress_log_received ON ingress_log (received_at_ms)",
)

CREATE_PROCESSED = (
    "CREATE INDEX IF NOT EXISTS ingress_log_processed ON ingress_log (lane)"
    " WHERE state = 'processed'"
)
"""The index of the processed rows' lanes; its build reads the whole table, under the write lock."""

PROCESSED_EXISTS = (
    "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'ingress_log_processed'"
)

ROWS = "SELECT (SELECT max(rowid) FROM ingress_log) - (SELECT min(rowid) FROM ingress_log) + 1"
"""The table's rows, about: the span of its rowids (two seeks; NULL when empty).

Rows are deleted oldest first (the purge), so the span is their number, or more when rows in
between are gone (purged processed rows among kept abandoned ones): never fewer.
"""

COLUMNS = (
    "id, source, tenant, key, topic, lane, event_id, received_at_ms, headers, body, state,"
    " produce_attempts, replay_count, last_error, produced_at_ms"
)

INSERT = """
    INSERT INTO ingress_log
        (id, source, tenant, key, topic, lane, event_id, received_at_ms, headers, body)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (source, event_id) DO NOTHING
"""

DELETE_PROBE = "DELETE FROM ingress_log WHERE id = ?"
"""Delete the row a write probe inserted in the same transaction; params: its id."""


def existing_ids(count: int) -> str:
    """Which of ``count`` ids exist; params: the ids."""
    return f"SELECT id FROM ingress_log WHERE id IN ({_marks(count, 1)})"  # noqa: S608


def mark_produced(count: int) -> str:
    """``received -> produced`` for ``count`` ids; params: now_ms, then the ids."""
    return f"""
        UPDATE ingress_log
        SET state = CASE WHEN state = 'received' THEN 'produced' ELSE state END,
            produced_at_ms = ?1, produce_attempts = produce_attempts + 1, lease_until_ms = 0
        WHERE id IN ({_marks(count, 2)})
    """  # noqa: S608 - only placeholders are interpolated


def record_failure(count: int) -> str:
    """Count a failed attempt for ``count`` ids; params: error, then the ids."""
    return f"""
        UPDATE ingress_log
        SET produce_attempts = produce_attempts + 1, last_error = ?1
        WHERE id IN ({_marks(count, 2)})
    """  # noqa: S608


def mark_processed(count: int) -> str:
    """``received|produced -> processed`` for ``count`` ids; params: the ids."""
    return f"""
        UPDATE ingress_log SET state = 'processed', lease_until_ms = 0
        WHERE state IN ('received', 'produced') AND id IN ({_marks(count, 1)})
    """  # noqa: S608


def mark_running(count: int) -> str:
    """A ``produced`` row's event still runs: its patience starts again; params: now, ids."""
    return f"""
        UPDATE ingress_log SET produced_at_ms = ?1
        WHERE state = 'produced' AND id IN ({_marks(count, 2)})
    """  # noqa: S608


def mark_replayed(count: int) -> str:
    """One more replay for ``count`` ids (abandoned rows are watched again); params: now, ids."""
    return f"""
        UPDATE ingress_log
        SET replay_count = replay_count + 1, produce_attempts = produce_attempts + 1,
            produced_at_ms = ?1, lease_until_ms = 0,
            state = CASE WHEN state IN ('received', 'abandoned') THEN 'produced' ELSE state END
        WHERE id IN ({_marks(count, 2)})
    """  # noqa: S608


def mark_replayed_by_hand(count: int) -> str:
    """A replay by hand for ``count`` ids: the sweeper's count starts again; params: now, ids."""
    return f"""
        UPDATE ingress_log
        SET replay_count = 0, produce_attempts = produce_attempts + 1,
            produced_at_ms = ?1, lease_until_ms = 0,
            state = CASE WHEN state IN ('received', 'abandoned') THEN 'produced' ELSE state END
        WHERE id IN ({_marks(count, 2)})
    """  # noqa: S608


def abandon(count: int) -> str:
    """``-> abandoned`` for ``count`` ids not yet processed, replayed at least ``?2`` times.

    Params: reason, min_replays, then the ids.
    """
    return f"""
        UPDATE ingress_log SET state = 'abandoned', last_error = ?1, lease_until_ms = 0
        WHERE state IN ('received', 'produced') AND replay_count >= ?2
          AND id IN ({_marks(count, 3)})
    """  # noqa: S608


CLAIM_UNPRODUCED = f"""
    UPDATE ingress_log SET lease_until_ms = :lease_until
    WHERE id IN (
        SELECT id FROM ingress_log
        WHERE state = 'received' AND received_at_ms < :before AND lease_until_ms <= :now
        ORDER BY received_at_ms LIMIT :limit
    )
    RETURNING {COLUMNS}
"""  # noqa: S608


def claim_unprocessed(patient_topics: int, overdue_topics: int = 0) -> str:
    """Lease produced rows past patience; ``patient_topics`` placeholders from ``?5`` on.

    Params: lease_until, now, before, overdue_before, the patient topics, limit, then
    ``overdue_topics`` pairs of a patient topic and its own overdue_before.
    """
    patient = f"topic IN ({_marks(patient_topics, 5)})" if patient_topics else "0"
    first = 6 + patient_topics
    overdue = "?4"
    if overdue_topics:
        whens = " ".join(
            f"WHEN ?{first + 2 * n} THEN ?{first + 2 * n + 1}" for n in range(overdue_topics)
        )
        overdue = f"CASE topic {whens} ELSE ?4 END"
    return f"""
        UPDATE ingress_log SET lease_until_ms = ?1
        WHERE id IN (
            SELECT id FROM ingress_log
            WHERE state = 'produced' AND lease_until_ms <= ?2 AND produced_at_ms < ?3
              AND (NOT ({patient}) OR produced_at_ms < {overdue})
            ORDER BY produced_at_ms LIMIT ?{5 + patient_topics}
        )
        RETURNING {COLUMNS}
    """  # noqa: S608


def where(selection: Selection) -> tuple[str, list[object]]:
    """The ``WHERE`` clause (without the keyword) and its params for ``selection``."""
    clauses: list[str] = ["1"]
    params: list[object] = []
    if selection.source is not None:
        clauses.append("source = ?")
        params.append(selection.source)
    if selection.tenant is not None:
        clauses.append("tenant = ?")
        params.append(selection.tenant)
    if selection.since_ms is not None:
        clauses.append("received_at_ms >= ?")
        params.append(selection.since_ms)
    if selection.until_ms is not None:
        clauses.append("received_at_ms < ?")
        params.append(selection.until_ms)
    if selection.states:
        clauses.append(f"state IN ({', '.join('?' * len(selection.states))})")
        params.extend(str(state) for state in selection.states)
    if selection.ids:
        clauses.append(f"id IN ({', '.join('?' * len(selection.ids))})")
        params.extend(selection.ids)
    if selection.through_id is not None:
        clauses.append("id <= ?")
        params.append(selection.through_id)
    return " AND ".join(clauses), params


def select(selection: Selection) -> tuple[str, list[object]]:
    """A page of ``selection`` after an id; append params ``after_id`` and ``limit``."""
    clause, params = where(selection)
    return (
        f"SELECT {COLUMNS} FROM ingress_log WHERE {clause} AND id > ? ORDER BY id LIMIT ?",  # noqa: S608
        params,
    )


def last_id(selection: Selection) -> tuple[str, list[object]]:
    """The highest id of ``selection`` (none: no row)."""
    clause, params = where(selection)
    return f"SELECT id FROM ingress_log WHERE {clause} ORDER BY id DESC LIMIT 1", params  # noqa: S608


def count_by_state(selection: Selection) -> tuple[str, list[object]]:
    """Row counts per state of ``selection``."""
    clause, params = where(selection)
    return f"SELECT state, count(*) FROM ingress_log WHERE {clause} GROUP BY state", params  # noqa: S608


HAS_PROCESSED = "SELECT 1 FROM ingress_log WHERE lane = ? AND state = 'processed' LIMIT 1"
"""Whether a row of a lane is processed (``ingress_log_processed``); params: the lane.

Run only once :data:`PROCESSED_EXISTS` found the index: without it, it scans the table.
"""

GET = f"SELECT {COLUMNS} FROM ingress_log WHERE id = ?"  # noqa: S608

OLDEST_UNFINISHED = """
    SELECT received_at_ms FROM ingress_log
    WHERE received_at_ms < ? AND state IN ('received', 'produced')
    ORDER BY received_at_ms LIMIT 1
"""
"""The receive time of the oldest row not processed or abandoned received before ``?``.

It walks ``ingress_log_received`` from its oldest end and stops at the first such row: it reads
only the finished rows older than that, which ``pipeline purge`` deletes.
"""


def purge(states: int) -> str:
    """Delete the oldest ``?3`` old rows in ``states`` states; returns their receive times.

    Params: older_than_ms, from_ms (the newest time an earlier chunk deleted, so rows it kept
    are not scanned again), the most rows, then the states.
    """
    return f"""
        DELETE FROM ingress_log
        WHERE id IN (
            SELECT id FROM ingress_log
            WHERE received_at_ms < ?1 AND received_at_ms >= ?2 AND state IN ({_marks(states, 4)})
            ORDER BY received_at_ms LIMIT ?3
        )
        RETURNING received_at_ms
    """  # noqa: S608


def _marks(count: int, first: int) -> str:
    """Numbered placeholders ``?first, ..., ?(first + count - 1)``."""
    return ", ".join(f"?{n}" for n in range(first, first + count))
