"""Every SQL statement of the PostgreSQL log store, composed with the configured schema.

The table and its indexes mirror the SQLite ones (see :mod:`pipeline.logstore.sqlite.sql`), with
``jsonb`` headers and ``bytea`` bodies. Claims use ``FOR UPDATE SKIP LOCKED`` so several sweepers
(one per ingress replica) take disjoint rows without waiting on each other.
"""

from __future__ import annotations

from typing import LiteralString

from psycopg import sql

from pipeline.logstore.protocol import Selection

COLUMNS = sql.SQL(
    "id, source, tenant, key, topic, lane, event_id, received_at_ms, headers, body, state,"
    " produce_attempts, replay_count, last_error, produced_at_ms"
)

_MIGRATE_LOCK = "SELECT pg_advisory_xact_lock(hashtext('pipeline.logstore.migrate'))"
"""Serialises the migrations of every store of the database, held to the migration's commit."""

_FOUND = """
SELECT c.relname::text
FROM pg_namespace n
LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = ANY(%s)
WHERE n.nspname = {schema_name}
"""
"""Which of the names given exist in the schema (one NULL row: the schema only; none: not it).

A name of any relation, as ``IF NOT EXISTS`` would find it. Read from the catalog: no lock is
taken on the table.
"""

_CREATE_SCHEMA = "CREATE SCHEMA IF NOT EXISTS {schema}"

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS {table} (
    id               text PRIMARY KEY,
    source           text NOT NULL,
    tenant           text NOT NULL,
    key              text NOT NULL,
    topic            text NOT NULL,
    lane             text NOT NULL,
    event_id         text NOT NULL,
    received_at_ms   bigint NOT NULL,
    headers          jsonb NOT NULL,
    body             bytea NOT NULL,
    state            text NOT NULL DEFAULT 'received',
    produce_attempts integer NOT NULL DEFAULT 0,
    replay_count     integer NOT NULL DEFAULT 0,
    last_error       text NOT NULL DEFAULT '',
    produced_at_ms   bigint,
    lease_until_ms   bigint NOT NULL DEFAULT 0,
    UNIQUE (source, event_id)
)
"""

_OBJECTS: tuple[tuple[str, LiteralString], ...] = (
    ("ingress_log", _CREATE_TABLE),
    (
        "ingress_log_unproduced",
        (
            "CREATE INDEX IF NOT EXISTS ingress_log_unproduced ON {table} (received_at_ms)"
            " WHERE state = 'received'"
        ),
    ),
    (
        "ingress_log_unprocessed",
        (
            "CREATE INDEX IF NOT EXISTS ingress_log_unprocessed ON {table} (produced_at_ms)"
            " WHERE state = 'produced'"
        ),
    ),
    (
        "ingress_log_received",
        "CREATE INDEX IF NOT EXISTS ingress_log_received ON {table} (received_at_ms)",
    ),
)
"""The table and its first indexes, each with the statement that makes it, in creation order.

Run in one transaction under :data:`_MIGRATE_LOCK`, and only those :data:`_FOUND` does not
find: ``CREATE INDEX IF NOT EXISTS`` of an index that exists still takes the table's SHARE lock
and holds it to the commit, so an open that ran them all queued behind any long write of the
table (a purge), and every insert of every replica queued behind that open. A log with all of
them is opened without a lock on its table. The index of the processed rows' lanes, added
later, is not among them: a plain ``CREATE INDEX`` holds off every insert and update of the
table while it reads it, so that one is built only on a new or small table (the store's
``processed_index_max_rows``, from :data:`_PROCESSED` and :data:`_ROWS`); a larger table's is
left to :data:`PROCESSED_COMMAND`.
"""

_PROCESSED = """
SELECT i.indisvalid, pg_relation_size(t.oid)
FROM pg_class t
JOIN pg_namespace n ON n.oid = t.relnamespace
LEFT JOIN pg_class ic ON ic.relnamespace = n.oid AND ic.relname = 'ingress_log_processed'
LEFT JOIN pg_index i ON i.indexrelid = ic.oid AND i.indrelid = t.oid
WHERE n.nspname = {schema_name} AND t.relname = 'ingress_log'
"""
"""Whether ``ingress_log_processed`` is valid (None: missing), and the table's bytes."""

_ROWS = "EXPLAIN (FORMAT JSON) SELECT FROM {table}"
"""The planner's estimate of the table's rows: no row is read, nothing is locked for writes.

The last ``ANALYZE``'s rows per page times the pages the table has now (never analyzed: its
pages, at least 10, and the width of its columns).
"""

_CREATE_PROCESSED = """
DROP INDEX IF EXISTS {processed};
CREATE INDEX ingress_log_processed ON {table} (lane) WHERE state = 'processed';
"""
"""(Re)build the index of the processed rows' lanes: only a new or small table's."""

PROCESSED_COMMAND = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS ingress_log_processed ON {table} (lane)"
    " WHERE state = 'processed'"
)
"""What an operator runs for a large table's index (a ``str.format`` of the table's name)."""

_INSERT = """
INSERT INTO {table}
    (id, source, tenant, key, topic, lane, event_id, received_at_ms, headers, body)
SELECT id, source, tenant, key, topic, lane, event_id, received_at_ms, headers::jsonb, body
FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],
            %b::text[], %b::bigint[], %b::text[], %b::bytea[])
    AS u(id, source, tenant, key, topic, lane, event_id, received_at_ms, headers, body)
ON CONFLICT (source, event_id) DO NOTHING
RETURNING id
"""

_DELETE_PROBE = "DELETE FROM {table} WHERE id = %s"
"""Delete the row a write probe inserted in the same transaction; params: its id."""

_MARK_PRODUCED = """
UPDATE {table}
SET state = CASE WHEN state = 'received' THEN 'produced' ELSE state END,
    produced_at_ms = %s, produce_attempts = produce_attempts + 1, lease_until_ms = 0
WHERE id = ANY(%s)
"""

_RECORD_FAILURE = """
UPDATE {table} SET produce_attempts = produce_attempts + 1, last_error = %s
WHERE id = ANY(%s)
"""

_MARK_PROCESSED = """
UPDATE {table} SET state = 'processed', lease_until_ms = 0
WHERE state IN ('received', 'produced') AND id = ANY(%s)
"""

_MARK_RUNNING = """
UPDATE {table} SET produced_at_ms = %s
WHERE state = 'produced' AND id = ANY(%s)
"""

_MARK_REPLAYED = """
UPDATE {table}
SET replay_count = replay_count + 1, produce_attempts = produce_attempts + 1,
    produced_at_ms = %s, lease_until_ms = 0,
    state = CASE WHEN state IN ('received', 'abandoned') THEN 'produced' ELSE state END
WHERE id = ANY(%s)
"""

_MARK_REPLAYED_BY_HAND = """
UPDATE {table}
SET replay_count = 0, produce_attempts = produce_attempts + 1,
    produced_at_ms = %s, lease_until_ms = 0,
    state = CASE WHEN state IN ('received', 'abandoned') THEN 'produced' ELSE state END
WHERE id = ANY(%s)
"""

_ABANDON = """
UPDATE {table} SET state = 'abandoned', last_error = %s, lease_until_ms = 0
WHERE state IN ('received', 'produced') AND replay_count >= %s AND id = ANY(%s)
"""

_CLAIM_UNPRODUCED = """
UPDATE {table} SET lease_until_ms = %(lease_until)s
WHERE id IN (
    SELECT id FROM {table}
    WHERE state = 'received' AND received_at_ms < %(before)s AND lease_until_ms <= %(now)s
    ORDER BY received_at_ms LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING {columns}
"""

_CLAIM_UNPROCESSED = """
UPDATE {table} SET lease_until_ms = %(lease_until)s
WHERE id IN (
    SELECT id FROM {table}
    WHERE state = 'produced' AND lease_until_ms <= %(now)s AND produced_at_ms < %(before)s
      AND (NOT (topic = ANY(%(patient)s)) OR produced_at_ms < COALESCE(
        (SELECT o.at_ms FROM unnest(%(overdue_topics)s::text[], %(overdue_times)s::bigint[])
            AS o(name, at_ms) WHERE o.name = topic),
        %(overdue)s))
    ORDER BY produced_at_ms LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING {columns}
"""

_HAS_PROCESSED = """
SELECT CASE WHEN EXISTS (
    SELECT FROM pg_index i
    JOIN pg_class c ON c.oid = i.indexrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = {schema_name} AND c.relname = 'ingress_log_processed' AND i.indisvalid
) THEN COALESCE((
    SELECT lane FROM {table} WHERE state = 'processed' AND lane >= %(lane)s
    ORDER BY lane LIMIT 1
) = %(lane)s, false) END
"""
"""Whether a row of a lane is processed; NULL without a valid ``ingress_log_processed``.

The lane's rows are looked for only with the index (the uncorrelated subquery is evaluated when
the ``CASE`` reaches it): without it the question would scan the table. With it, the first
processed lane from the one asked, in the index's order (none: false), is one look into the
index, reading at most one entry; any other plan would read and sort every processed row.

Not ``EXISTS (... WHERE lane = %(lane)s AND state = 'processed')``: the planner multiplies the
selectivities of the two conditions, expects thousands of matches on an analyzed table of many
processed rows, and scans the table to stop at the first; for exactly the lane the sweeper asks
about (none of whose rows is processed) it finds none and reads every row, every sweep.
"""

_GET = "SELECT {columns} FROM {table} WHERE id = %s"

_OLDEST_UNFINISHED = """
SELECT received_at_ms FROM {table}
WHERE received_at_ms < %s AND state IN ('received', 'produced')
ORDER BY received_at_ms LIMIT 1
"""

_PURGE = """
WITH chosen AS (
    SELECT id, received_at_ms FROM {table}
    WHERE received_at_ms < %(before)s AND received_at_ms >= %(from)s AND state = ANY(%(states)s)
    ORDER BY received_at_ms LIMIT %(limit)s
), gone AS (
    DELETE FROM {table}
    WHERE id = ANY(ARRAY(SELECT id FROM chosen))
      AND received_at_ms < %(before)s AND state = ANY(%(states)s)
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM chosen),
    (SELECT max(received_at_ms) FROM chosen)
"""
"""One batch of a purge: the oldest ``limit`` old rows in ``states`` from ``from``, deleted.

Returns the rows deleted, the rows chosen (fewer than ``limit``: the last batch) and the newest
time chosen (where the next batch starts, so rows kept are not read again). The chosen rows are
found by their primary key (a join would read the whole table each batch). The conditions are
repeated on the deleted row: one another transaction changed meanwhile (an abandoned row
replayed) is read again after it commits and kept if it no longer matches.
"""


class Statements:
    """The statements for one schema, composed once."""

    def __init__(self, schema: str) -> None:
        """Compose every statement for ``schema``.``ingress_log``."""
        self.table = sql.Identifier(schema, "ingress_log")
        names = {
            "schema": sql.Identifier(schema),
            "schema_name": sql.Literal(schema),
            "table": self.table,
            "processed": sql.Identifier(schema, "ingress_log_processed"),
            "columns": COLUMNS,
        }

        def compose(text: LiteralString) -> sql.Composed:
            return sql.SQL(text).format(**names)

        self.migrate_lock = compose(_MIGRATE_LOCK)
        self.found = compose(_FOUND)
        self.create_schema = compose(_CREATE_SCHEMA)
        self.objects = [(name, compose(statement)) for name, statement in _OBJECTS]
        self.processed = compose(_PROCESSED)
        self.rows = compose(_ROWS)
        self.create_processed = compose(_CREATE_PROCESSED)
        self.insert = compose(_INSERT)
        self.delete_probe = compose(_DELETE_PROBE)
        self.mark_produced = compose(_MARK_PRODUCED)
        self.record_failure = compose(_RECORD_FAILURE)
        self.mark_processed = compose(_MARK_PROCESSED)
        self.mark_running = compose(_MARK_RUNNING)
        self.mark_replayed = compose(_MARK_REPLAYED)
        self.mark_replayed_by_hand = compose(_MARK_REPLAYED_BY_HAND)
        self.abandon = compose(_ABANDON)
        self.claim_unproduced = compose(_CLAIM_UNPRODUCED)
        self.claim_unprocessed = compose(_CLAIM_UNPROCESSED)
        self.has_processed = compose(_HAS_PROCESSED)
        self.get = compose(_GET)
        self.oldest_unfinished = compose(_OLDEST_UNFINISHED)
        self.purge = compose(_PURGE)

    def select(self, selection: Selection) -> tuple[sql.Composed, list[object]]:
        """A page of ``selection`` after an id; append params ``after_id`` and ``limit``."""
        clause, params = _where(selection)
        query = sql.SQL(
            "SELECT {columns} FROM {table} WHERE {clause} AND id > %s ORDER BY id LIMIT %s"
        ).format(columns=COLUMNS, table=self.table, clause=clause)
        return query, params

    def last_id(self, selection: Selection) -> tuple[sql.Composed, list[object]]:
        """The highest id of ``selection`` (none: no row)."""
        clause, params = _where(selection)
        query = sql.SQL("SELECT id FROM {table} WHERE {clause} ORDER BY id DESC LIMIT 1")
        return query.format(table=self.table, clause=clause), params

    def count_by_state(self, selection: Selection) -> tuple[sql.Composed, list[object]]:
        """Row counts per state of ``selection``."""
        clause, params = _where(selection)
        query = sql.SQL("SELECT state, count(*) FROM {table} WHERE {clause} GROUP BY state")
        return query.format(table=self.table, clause=clause), params


def _where(selection: Selection) -> tuple[sql.Composable, list[object]]:
    clauses: list[sql.Composable] = [sql.SQL("true")]
    params: list[object] = []
    for column, op, value in (
        ("source", "=", selection.source),
        ("tenant", "=", selection.tenant),
        ("received_at_ms", ">=", selection.since_ms),
        ("received_at_ms", "<", selection.until_ms),
    ):
        if value is not None:
            clauses.append(sql.SQL("{} {} %s").format(sql.Identifier(column), sql.SQL(op)))
            params.append(value)
    if selection.states:
        clauses.append(sql.SQL("state = ANY(%s)"))
        params.append([str(state) for state in selection.states])
    if selection.ids:
        clauses.append(sql.SQL("id = ANY(%s)"))
        params.append(list(selection.ids))
    if selection.through_id is not None:
        clauses.append(sql.SQL("id <= %s"))
        params.append(selection.through_id)
    return sql.SQL(" AND ").join(clauses), params
