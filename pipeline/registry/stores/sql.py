"""What the SQLite and PostgreSQL registry stores share: the reads and the plain writes.

Each store keeps its own statements (placeholders and SQL dialect differ), its own transaction
(a locked connection, or a pooled one) and its own ``register``; the methods below run a
store's :class:`Statements` inside its ``_tx`` and are the same for both.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from contextlib import AbstractContextManager, closing
from typing import Any, ClassVar, NamedTuple

from pipeline.registry.errors import IdConflict, RegistryError
from pipeline.registry.stores.protocol import (
    MAX_ID,
    Check,
    SettingKind,
    StoredSchema,
    SubjectVersion,
)


class Statements(NamedTuple):
    """One dialect's statements for the shared methods (parameters in the documented order)."""

    schema: str
    """id -> (id, schema_type, schema)."""
    versions: str
    """subject -> version rows, oldest first."""
    usages: str
    """schema id -> version rows."""
    subjects: str
    """-> (subject, whether every version is soft-deleted)."""
    mark_deleted: str
    """(subject, version) -> soft-delete."""
    purge: str
    """(subject, version) -> delete if soft-deleted."""
    get_setting: str
    """(kind, subject) -> (value,)."""
    set_setting: str
    """(kind, subject, value) -> upsert."""
    delete_setting: str
    """(kind, subject) -> delete returning (value,)."""


def version_row(row: Sequence[Any]) -> SubjectVersion:
    """A version row (subject, version, id, schema, fingerprint, deleted) as a model."""
    return SubjectVersion(row[0], row[1], row[2], row[3], row[4], bool(row[5]))


def generated_id(new_id: int) -> int:
    """``new_id``, a schema id the database generated, if clients can read it.

    Raises:
        RegistryError: it is past :data:`MAX_ID` (the caller's transaction rolls back).
    """
    if new_id > MAX_ID:
        raise RegistryError(
            f"no schema id left for a new schema: the next one would be {new_id}, past 2^31-1, "
            "the largest id Confluent clients read; a new schema can still be registered with "
            "a free id given explicitly in IMPORT mode"
        )
    return new_id


def appended_version(subject: str, existing: Sequence[SubjectVersion], wanted: int | None) -> int:
    """The number of the version appended to ``subject``: ``wanted``, else one above the last.

    Raises:
        IdConflict: ``wanted`` is taken.
        RegistryError: the next number would be past :data:`MAX_ID`.
    """
    if wanted is not None and any(v.version == wanted for v in existing):
        raise IdConflict(f"subject {subject!r} already has a version {wanted}")
    number = wanted or max((v.version for v in existing), default=0) + 1
    if number > MAX_ID:
        raise RegistryError(
            f"subject {subject!r} has no version number left: the next one would be {number}, "
            "past 2^31-1, the largest version Confluent clients read; permanently delete its "
            "last version to free the number, or register under another subject"
        )
    return number


class SqlRegistryStore(abc.ABC):
    """The shared methods of the SQL registry stores."""

    _sql: ClassVar[Statements]

    @abc.abstractmethod
    def _tx(self, *, write: bool = False) -> AbstractContextManager[Any]:
        """A transaction yielding a DB-API connection (``StoreError`` on database errors)."""

    def schema(self, schema_id: int) -> StoredSchema | None:
        """The schema with this global id, or None."""
        with self._tx() as conn:
            row = conn.execute(self._sql.schema, (schema_id,)).fetchone()
        return StoredSchema(int(row[0]), row[1], row[2]) if row else None

    def versions(self, subject: str) -> list[SubjectVersion]:
        """Every version of ``subject``, soft-deleted ones included, oldest first."""
        with self._tx() as conn:
            return [version_row(r) for r in conn.execute(self._sql.versions, (subject,))]

    def subjects(self) -> dict[str, bool]:
        """Every subject with a version: name -> whether all its versions are soft-deleted."""
        with self._tx() as conn:
            return {row[0]: bool(row[1]) for row in conn.execute(self._sql.subjects)}

    def usages(self, schema_id: int) -> list[SubjectVersion]:
        """Every subject version holding the schema ``schema_id``."""
        with self._tx() as conn:
            return [version_row(r) for r in conn.execute(self._sql.usages, (schema_id,))]

    def mark_deleted(self, subject: str, versions: Sequence[int]) -> None:
        """Soft-delete these versions."""
        self._each(self._sql.mark_deleted, [(subject, v) for v in versions])

    def purge(self, subject: str, versions: Sequence[int]) -> None:
        """Remove these versions for good if soft-deleted (see the protocol); ids stay valid."""
        self._each(self._sql.purge, [(subject, v) for v in versions])

    def purge_subject(self, subject: str, check: Check) -> list[int]:
        """Remove every version and own setting of ``subject`` in one step (see the protocol)."""
        with self._tx(write=True) as conn:
            self._lock_subject(conn, subject)
            every = [version_row(r) for r in conn.execute(self._sql.versions, (subject,))]
            check(every)
            for v in every:
                conn.execute(self._sql.purge, (subject, v.version))
            for kind in ("compatibility", "mode"):
                conn.execute(self._sql.delete_setting, (kind, subject)).fetchall()
        return [v.version for v in every]

    @abc.abstractmethod
    def _lock_subject(self, conn: Any, subject: str) -> None:
        """Take, for the write transaction ``conn``, the subject lock registrations take."""

    def get_setting(self, kind: SettingKind, subject: str) -> str | None:
        """The value set for ``subject`` (``""`` for global), or None."""
        with self._tx() as conn:
            row = conn.execute(self._sql.get_setting, (kind, subject)).fetchone()
        return str(row[0]) if row else None

    def set_setting(self, kind: SettingKind, subject: str, value: str) -> None:
        """Set (or replace) a value."""
        with self._tx(write=True) as conn:
            conn.execute(self._sql.set_setting, (kind, subject, value))

    def delete_setting(self, kind: SettingKind, subject: str) -> str | None:
        """Remove a value; return the one removed, or None."""
        with self._tx(write=True) as conn:
            rows = conn.execute(self._sql.delete_setting, (kind, subject)).fetchall()
        return str(rows[0][0]) if rows else None

    def _each(self, sql: str, params: list[tuple[str, int]]) -> None:
        with self._tx(write=True) as conn, closing(conn.cursor()) as cur:
            cur.executemany(sql, params)
