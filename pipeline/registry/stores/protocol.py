"""What the registry keeps, and the interface of the stores that keep it.

Two implementations pass one contract suite (``tests/contract/base/registry_store.py``):
:class:`SqliteSchemaStore` (embedded, one file, one process) and :class:`PostgresSchemaStore`
(several registry replicas on one database). Both guarantee:

* **ids are global and stable**: one id per normalised schema (unique fingerprint), whatever
  subject it is registered under, kept after the versions using it are deleted, so a reader can
  always resolve an id it once saw;
* **registration is idempotent**: registering a schema a subject already holds (live) returns
  that version and id (asked with another explicit id, it is not the same registration);
* **registration is serialised per subject**: the compatibility ``check`` runs inside the
  transaction that appends the version, under a per-subject lock, so two concurrent writers can
  never both append against the same "latest" version; two replicas registering the same schema
  concurrently get one id.

Methods are synchronous; the API calls them from a thread pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pipeline.registry.canonical import ParsedSchema

SettingKind = Literal["compatibility", "mode"]
GLOBAL = ""
"""The ``subject`` under which global settings are kept."""
MAX_ID = 2**31 - 1
"""The largest schema id and version number, as in Confluent (a Java ``int``): clients read
nothing larger, so the stores never generate a larger one."""


@dataclass(frozen=True, slots=True)
class StoredSchema:
    """A schema as stored: its global id and its normalised text."""

    id: int
    schema_type: str
    schema: str


@dataclass(frozen=True, slots=True)
class SubjectVersion:
    """One version of a subject.

    Attributes:
        subject: the subject name.
        version: 1, 2, ...; never reused while the version exists (even soft-deleted).
        schema_id: the global id of its schema.
        schema: the normalised schema text.
        fingerprint: SHA-256 of ``schema``.
        deleted: soft-deleted (hidden unless asked for with ``deleted=true``).
    """

    subject: str
    version: int
    schema_id: int
    schema: str
    fingerprint: str
    deleted: bool


Check = Callable[[Sequence[SubjectVersion]], None]
"""Called with the subject's live versions (oldest first) before a version is appended;
raises (e.g. :class:`~pipeline.registry.errors.IncompatibleSchema`) to refuse it."""


class SchemaStore(Protocol):
    """Subjects, versions and schemas by id."""

    def register(
        self,
        subject: str,
        schema: ParsedSchema,
        check: Check,
        *,
        schema_id: int | None = None,
        version: int | None = None,
    ) -> SubjectVersion:
        """Append ``schema`` to ``subject`` unless a live version already holds it.

        Idempotent: a schema the subject holds live returns that version untouched (``check`` is
        not called), unless ``schema_id`` is given and is not that version's id; then ``check``
        decides, as for a new version. ``schema_id``/``version`` are for IMPORT mode. A new
        version removes for good the subject's soft-deleted earlier versions with its id.

        Raises:
            IdConflict: ``schema_id`` already holds another schema, or ``version`` exists.
            RegistryError: the id or version number generated would pass :data:`MAX_ID`
                (nothing is stored).
            StoreError: the database failed.
        """
        ...

    def schema(self, schema_id: int) -> StoredSchema | None:
        """The schema with this global id, or None."""
        ...

    def versions(self, subject: str) -> list[SubjectVersion]:
        """Every version of ``subject``, soft-deleted ones included, oldest first."""
        ...

    def subjects(self) -> dict[str, bool]:
        """Every subject with at least one version: name -> whether all are soft-deleted."""
        ...

    def usages(self, schema_id: int) -> list[SubjectVersion]:
        """Every subject version (soft-deleted too) that holds the schema ``schema_id``."""
        ...


class VersionRemover(Protocol):
    """Soft and permanent deletion of versions."""

    def mark_deleted(self, subject: str, versions: Sequence[int]) -> None:
        """Soft-delete these versions (they stay resolvable by id and by ``deleted=true``)."""
        ...

    def purge(self, subject: str, versions: Sequence[int]) -> None:
        """Remove these versions for good if they are soft-deleted; their schema ids stay valid.

        A live version is left alone: its number may be a new version's, registered after the
        caller saw the soft-deleted one it means.
        """
        ...

    def purge_subject(self, subject: str, check: Check) -> list[int]:
        """Remove every version of ``subject`` and its own settings for good; their numbers.

        One atomic step with registrations: ``check`` is called with every version (soft-deleted
        ones included, oldest first) under the lock a registration takes, and raises to refuse
        (nothing is removed); a registration or setting that comes after is kept.
        """
        ...


class SettingStore(Protocol):
    """Compatibility levels and modes, global (``subject=GLOBAL``) or per subject."""

    def get_setting(self, kind: SettingKind, subject: str) -> str | None:
        """The value set for ``subject`` (or globally), or None when none is set."""
        ...

    def set_setting(self, kind: SettingKind, subject: str, value: str) -> None:
        """Set (or replace) a value."""
        ...

    def delete_setting(self, kind: SettingKind, subject: str) -> str | None:
        """Remove a value; return the one removed, or None."""
        ...


class RegistryStore(SchemaStore, VersionRemover, SettingStore, Protocol):
    """Everything the registry needs from a database."""

    def close(self) -> None:
        """Release connections."""
        ...


def open_store(url: str, *, pool_max: int = 10) -> RegistryStore:
    """Open the store named by ``url``: ``sqlite:///path`` or ``postgresql://...``.

    Raises:
        ConfigError: the URL names no supported store.
        StoreError: the database cannot be opened.
    """
    if url.startswith("sqlite://"):
        from pipeline.registry.stores.sqlite.store import SqliteSchemaStore  # noqa: PLC0415

        return SqliteSchemaStore(url.removeprefix("sqlite://").removeprefix("/") or ":memory:")
    if url.startswith(("postgresql://", "postgres://")):
        from pipeline.registry.stores.postgres.store import PostgresSchemaStore  # noqa: PLC0415

        return PostgresSchemaStore(url, pool_max=pool_max)
    from pipeline.errors import ConfigError  # noqa: PLC0415

    raise ConfigError(
        f"unsupported registry store {url!r}: expected sqlite:///path or postgresql://..."
    )
