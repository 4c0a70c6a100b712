"""The embedded registry store: one SQLite file (WAL), every statement in this module.

One connection serves every thread behind a lock; registrations take the database write lock
(``BEGIN IMMEDIATE``) before reading the subject, so the compatibility check and the append are
one atomic step even with several processes on the same file. Use
:class:`~pipeline.registry.stores.postgres.store.PostgresSchemaStore` for several registry replicas.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pipeline.registry.canonical import ParsedSchema
from pipeline.registry.errors import IdConflict, SchemaIdTaken, StoreError
from pipeline.registry.stores.protocol import Check, SubjectVersion
from pipeline.registry.stores.sql import (
    SqlRegistryStore,
    Statements,
    appended_version,
    generated_id,
    version_row,
)

_DDL = """
CREATE TABLE IF NOT EXISTS registry_schemas (
    id          INTEGER PRIMARY KEY,
    fingerprint TEXT NOT NULL UNIQUE,
    schema_type TEXT NOT NULL,
    schema      TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS registry_versions (
    subject   TEXT NOT NULL,
    version   INTEGER NOT NULL,
    schema_id INTEGER NOT NULL REFERENCES registry_schemas (id),
    deleted   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (subject, version)
);
CREATE INDEX IF NOT EXISTS registry_versions_by_schema ON registry_versions (schema_id);
CREATE TABLE IF NOT EXISTS registry_settings (
    kind    TEXT NOT NULL,
    subject TEXT NOT NULL,
    value   TEXT NOT NULL,
    PRIMARY KEY (kind, subject)
);
"""
_VERSION_COLUMNS = """
SELECT v.subject, v.version, v.schema_id, s.schema, s.fingerprint, v.deleted
FROM registry_versions v JOIN registry_schemas s ON s.id = v.schema_id
"""
_VERSIONS = _VERSION_COLUMNS + "WHERE v.subject = ? ORDER BY v.version"
_USAGES = _VERSION_COLUMNS + "WHERE v.schema_id = ? ORDER BY v.subject, v.version"
_SCHEMA = "SELECT id, schema_type, schema FROM registry_schemas WHERE id = ?"
_ID_BY_FINGERPRINT = "SELECT id FROM registry_schemas WHERE fingerprint = ?"
_INSERT_SCHEMA = (
    "INSERT INTO registry_schemas (fingerprint, schema_type, schema) VALUES (?, ?, ?) "
    "ON CONFLICT (fingerprint) DO NOTHING RETURNING id"
)
_INSERT_SCHEMA_WITH_ID = (
    "INSERT INTO registry_schemas (id, fingerprint, schema_type, schema) VALUES (?, ?, ?, ?)"
)
_INSERT_VERSION = (
    "INSERT INTO registry_versions (subject, version, schema_id, deleted) VALUES (?, ?, ?, 0)"
)
_SUBJECTS = "SELECT subject, MIN(deleted) FROM registry_versions GROUP BY subject ORDER BY subject"
_MARK_DELETED = "UPDATE registry_versions SET deleted = 1 WHERE subject = ? AND version = ?"
_PURGE = "DELETE FROM registry_versions WHERE subject = ? AND version = ? AND deleted = 1"
_GET_SETTING = "SELECT value FROM registry_settings WHERE kind = ? AND subject = ?"
_SET_SETTING = (
    "INSERT INTO registry_settings (kind, subject, value) VALUES (?, ?, ?) "
    "ON CONFLICT (kind, subject) DO UPDATE SET value = excluded.value"
)
_DELETE_SETTING = "DELETE FROM registry_settings WHERE kind = ? AND subject = ? RETURNING value"


class SqliteSchemaStore(SqlRegistryStore):
    """Registry store in one SQLite file (``:memory:`` for a throwaway one)."""

    _sql = Statements(
        schema=_SCHEMA,
        versions=_VERSIONS,
        usages=_USAGES,
        subjects=_SUBJECTS,
        mark_deleted=_MARK_DELETED,
        purge=_PURGE,
        get_setting=_GET_SETTING,
        set_setting=_SET_SETTING,
        delete_setting=_DELETE_SETTING,
    )

    def __init__(self, path: str, *, busy_timeout_s: float = 5.0) -> None:
        """Open (and create if needed) the database at ``path``.

        Raises:
            StoreError: the file cannot be opened or initialised.
        """
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(
                path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(_DDL)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the registry database {path!r}: {exc}") from exc

    @contextmanager
    def _tx(self, *, write: bool = False) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"registry database error: {exc}") from exc

    def _lock_subject(self, conn: sqlite3.Connection, subject: str) -> None:
        """Nothing more: a write transaction already holds the database's write lock."""

    def register(
        self,
        subject: str,
        schema: ParsedSchema,
        check: Check,
        *,
        schema_id: int | None = None,
        version: int | None = None,
    ) -> SubjectVersion:
        """Append ``schema`` to ``subject`` unless a live version holds it (see the protocol)."""
        with self._tx(write=True) as db:
            existing = [version_row(r) for r in db.execute(_VERSIONS, (subject,))]
            live = [v for v in existing if not v.deleted]
            for v in live:
                if v.fingerprint == schema.fingerprint and schema_id in {None, v.schema_id}:
                    return v
            check(live)
            new_id = self._schema_id(db, schema, schema_id)
            number = appended_version(subject, existing, version)
            # As Confluent does, a new version removes the soft-deleted earlier ones of its id.
            for v in existing:
                if v.deleted and v.schema_id == new_id and v.version < number:
                    db.execute(_PURGE, (subject, v.version))
            db.execute(_INSERT_VERSION, (subject, number, new_id))
            return SubjectVersion(
                subject, number, new_id, schema.normalized, schema.fingerprint, deleted=False
            )

    @staticmethod
    def _schema_id(db: sqlite3.Connection, schema: ParsedSchema, wanted: int | None) -> int:
        found = db.execute(_ID_BY_FINGERPRINT, (schema.fingerprint,)).fetchone()
        if wanted is not None:
            if found is not None and found[0] != wanted:
                raise IdConflict(f"the schema already has id {found[0]}, not {wanted}")
            holder = db.execute(_SCHEMA, (wanted,)).fetchone()
            if found is None and holder is not None:
                raise SchemaIdTaken(wanted)
            if found is None:
                db.execute(
                    _INSERT_SCHEMA_WITH_ID, (wanted, schema.fingerprint, "AVRO", schema.normalized)
                )
            return wanted
        if found is not None:
            return int(found[0])
        inserted: int = db.execute(
            _INSERT_SCHEMA, (schema.fingerprint, "AVRO", schema.normalized)
        ).fetchall()[0][0]
        return generated_id(inserted)

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()
