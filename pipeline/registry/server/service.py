"""The registry's rules on top of a store: versions, deletes, compatibility and modes.

HTTP-free and synchronous; :mod:`pipeline.registry.server.api` maps requests onto these methods and
their :class:`~pipeline.registry.errors.RegistryError` onto Confluent error bodies. Only the
schema type ``AVRO`` is supported, and schema references are refused (42201).

Semantics follow Confluent Schema Registry:

* versions are numbered per subject from 1; a soft-deleted version keeps its number, is hidden
  unless ``deleted=True`` is asked for, and no longer takes part in compatibility checks; a new
  version with the id of soft-deleted ones removes those for good (the store does it);
* a permanent delete must follow a soft delete (40405 / 40407); ids stay resolvable after it;
* the compatibility level is the subject's own, else the global one, else the default given at
  construction (``BACKWARD``); the mode likewise (default ``READWRITE``);
* a schema the subject already holds (live, and under the id given if one is) answers its
  version and id in every mode: the schema is looked up before the mode is checked;
* ``READONLY`` refuses new versions and deletes (42205); ``IMPORT`` accepts an explicit
  ``id``/``version`` and skips the compatibility check, and refuses a new version without an
  ``id`` (42205); outside IMPORT an explicit id is refused unless it is the id the schema already
  has under the subject.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from pipeline.config import Compatibility
from pipeline.registry.canonical import DefaultsTooCostly, ParsedSchema, parse
from pipeline.registry.compat import check
from pipeline.registry.errors import (
    IncompatibleSchema,
    InvalidCompatibility,
    InvalidMode,
    InvalidSchema,
    InvalidVersion,
    OperationNotPermitted,
    SchemaNotFound,
    SubjectConfigNotFound,
    SubjectModeNotFound,
    SubjectNotFound,
    SubjectNotSoftDeleted,
    SubjectSoftDeleted,
    VersionNotFound,
    VersionNotSoftDeleted,
    VersionSoftDeleted,
    cut_middle,
)
from pipeline.registry.server.cache import ByteBoundedCache
from pipeline.registry.stores.protocol import GLOBAL, RegistryStore, StoredSchema, SubjectVersion

# Parsed stored schemas and schemas by id kept in memory, in bytes of schema text (a parsed
# tree takes a few times its text). Ids never change meaning, so nothing is ever stale.
_CACHE_MAX_BYTES = 16 * 1_048_576


class Mode(StrEnum):
    """What a subject (or the registry) accepts."""

    READWRITE = "READWRITE"
    READONLY = "READONLY"
    IMPORT = "IMPORT"


def parse_version(raw: str | int) -> int:
    """A version path segment as a number; ``latest`` (in any case) and ``-1`` become -1.

    Read as Confluent's ``VersionId`` reads it: trimmed, then ``latest`` compared
    case-insensitively, else an integer as Java's ``Integer.parseInt`` takes it (so no ``_``
    digit separators, which Python's ``int`` would accept).

    Raises:
        InvalidVersion: not a positive integer, -1 or ``latest``.
    """
    text = raw.strip() if isinstance(raw, str) else str(raw)
    if text.lower() == "latest":
        return -1
    try:
        number = 0 if "_" in text else int(text)
    except ValueError:
        number = 0
    if number == -1:
        return -1
    if number < 1 or number > 2**31 - 1:
        msg = f"The specified version '{raw}' is not a valid version id. Allowed values are "
        raise InvalidVersion(msg + 'between [1, 2^31-1] and the string "latest"')
    return number


def _check_register_mode(subject: str, mode: Mode, schema_id: int | None) -> None:
    """Refuse a new version the mode forbids, as Confluent's ``checkRegisterMode`` does.

    Raises:
        OperationNotPermitted: READONLY; an explicit id outside IMPORT; no id in IMPORT.
    """
    if mode is Mode.READONLY:
        raise OperationNotPermitted(f"Subject {subject} is in read-only mode")
    if mode is not Mode.IMPORT and schema_id is not None:
        raise OperationNotPermitted(
            f"Overwrite new schema with id {schema_id} is not permitted (not IMPORT mode)"
        )
    if mode is Mode.IMPORT and schema_id is None:
        raise OperationNotPermitted(f"Subject {subject} is not in read-write mode")


class Registry:
    """Registry operations over a :class:`~pipeline.registry.stores.protocol.RegistryStore`."""

    def __init__(
        self,
        store: RegistryStore,
        *,
        default_compatibility: Compatibility = Compatibility.BACKWARD,
        default_mode: Mode = Mode.READWRITE,
    ) -> None:
        """Serve ``store`` with these defaults for subjects and the registry without settings."""
        self.store = store
        self.default_compatibility = default_compatibility
        self.default_mode = default_mode
        self._parsed: ByteBoundedCache[str, ParsedSchema] = ByteBoundedCache(_CACHE_MAX_BYTES)
        self._by_id: ByteBoundedCache[int, StoredSchema] = ByteBoundedCache(_CACHE_MAX_BYTES)

    # -- schemas -------------------------------------------------------------------------------

    @property
    def cache_bytes(self) -> int:
        """Bytes of schema text held by the caches (parsed stored schemas and schemas by id)."""
        return self._parsed.size_bytes + self._by_id.size_bytes

    def parse(self, text: str, subject: str | None = None) -> ParsedSchema:
        """Parse a schema a client sent (never cached: readers must not fill the memory).

        Its defaults get the step bound unless ``subject`` already holds it (a version, live or
        soft-deleted): a release without the bound may have stored it, and its clients must
        still find and register it again.

        Raises:
            InvalidSchema: not a valid Avro schema, or one too costly to check that is new.
        """
        try:
            return parse(text)
        except DefaultsTooCostly as exc:
            if subject is None or all(
                v.fingerprint != exc.fingerprint for v in self.store.versions(subject)
            ):
                raise
        return parse(text, bounded=False)

    def parse_stored(self, text: str) -> ParsedSchema:
        """Parse a stored schema's text (no step bound), memoised in a byte-bounded cache."""
        hit = self._parsed.get(text)
        if hit is None:
            hit = parse(text, bounded=False)
            self._parsed.put(text, hit, len(text))
        return hit

    def schema(self, schema_id: int) -> StoredSchema:
        """The schema with this global id (cached: an id never changes meaning).

        Raises:
            SchemaNotFound: no schema has this id.
        """
        hit = self._by_id.get(schema_id)
        if hit is None:
            hit = self.store.schema(schema_id)
            if hit is None:
                raise SchemaNotFound(f"Schema {schema_id} not found")
            self._by_id.put(schema_id, hit, len(hit.schema))
        return hit

    def register(
        self,
        subject: str,
        text: str,
        *,
        schema_id: int | None = None,
        version: int | None = None,
    ) -> SubjectVersion:
        """Register ``text`` under ``subject``, checking compatibility and mode.

        Idempotent: a schema the subject already holds live returns its existing version and id
        in any mode (READONLY too), unless ``schema_id`` names another id.

        Raises:
            InvalidSchema: not a valid Avro schema.
            IncompatibleSchema: the subject's compatibility level refuses it; the message lists
                every rule broken with its field path.
            OperationNotPermitted: the mode forbids a new version.
        """
        parsed = self.parse(text, subject)
        mode = self.mode(subject)
        importing = mode is Mode.IMPORT
        if not importing and version is not None:
            raise OperationNotPermitted("a version may only be given in IMPORT mode")
        level = self.compatibility(subject)

        def incompatible(live: Sequence[SubjectVersion]) -> None:
            problems = check(
                parsed, [(v.version, self.parse_stored(v.schema)) for v in live], level
            )
            if problems:
                raise IncompatibleSchema(
                    "Schema being registered is incompatible with an earlier schema for "
                    f'subject "{subject}", details: ' + "; ".join(cut_middle(p) for p in problems)
                )

        # The check runs before the store's write lock is taken, so a slow check never stalls
        # other requests; under the lock it is repeated only if the live versions changed.
        checked: list[tuple[int, str]] | None = None
        if mode is Mode.READWRITE and schema_id is None:
            live_now = [v for v in self.store.versions(subject) if not v.deleted]
            if all(v.fingerprint != parsed.fingerprint for v in live_now):
                incompatible(live_now)
            checked = [(v.version, v.fingerprint) for v in live_now]

        # Called only when a new version would be appended: a schema the subject already holds
        # live (under the id given, if one is) is answered by the store before any mode rule,
        # as Confluent looks a schema up before it checks the mode.
        def gate(live: Sequence[SubjectVersion]) -> None:
            _check_register_mode(subject, mode, schema_id)
            if importing or checked == [(v.version, v.fingerprint) for v in live]:
                return
            incompatible(live)

        return self.store.register(subject, parsed, gate, schema_id=schema_id, version=version)

    def lookup(self, subject: str, text: str, *, deleted: bool = False) -> SubjectVersion:
        """The version of ``subject`` holding ``text`` (newest first if several).

        Raises:
            SubjectNotFound: the subject has no versions (visible ones unless ``deleted``).
            SchemaNotFound: it has, but none holds this schema.
        """
        try:
            fingerprint = self.parse(text, subject).fingerprint
        except DefaultsTooCostly as exc:  # new to the subject: not found there, as any other
            fingerprint = exc.fingerprint
        visible = self.versions(subject, deleted=deleted)
        for v in reversed(visible):
            if v.fingerprint == fingerprint:
                return v
        raise SchemaNotFound("Schema not found")

    def test(self, subject: str, text: str, version: str | None) -> list[str]:
        """Compatibility problems of ``text`` against ``version`` (None: as registration would).

        As in Confluent, ``latest`` with no live version (or no subject) has nothing to be
        incompatible with: no problems.

        Raises:
            InvalidVersion: ``version`` is not a version.
            VersionNotFound: a numbered ``version`` is not a live version of the subject.
        """
        parsed = self.parse(text, subject)
        level = self.compatibility(subject)
        live = [v for v in self.store.versions(subject) if not v.deleted]
        if version is None:
            against = live
        else:
            number = parse_version(version)
            against = live[-1:] if number == -1 else [v for v in live if v.version == number]
            if number != -1 and not against:
                raise VersionNotFound(f"Version {number} not found.")
            if level.transitive:
                level = Compatibility(level.value.removesuffix("_TRANSITIVE"))
        return check(parsed, [(v.version, self.parse_stored(v.schema)) for v in against], level)

    # -- subjects and versions -----------------------------------------------------------------

    def subjects(self, *, deleted: bool = False, deleted_only: bool = False) -> list[str]:
        """Subject names: live ones, plus soft-deleted ones if ``deleted``, or only those."""
        listed = self.store.subjects()
        if deleted_only:
            return [s for s, gone in listed.items() if gone]
        return [s for s, gone in listed.items() if deleted or not gone]

    def versions(
        self, subject: str, *, deleted: bool = False, deleted_only: bool = False
    ) -> list[SubjectVersion]:
        """The subject's versions, oldest first, filtered like :meth:`subjects`.

        Raises:
            SubjectNotFound: nothing to list.
        """
        every = self.store.versions(subject)
        if deleted_only:
            chosen = [v for v in every if v.deleted]
        else:
            chosen = [v for v in every if deleted or not v.deleted]
        if not chosen:
            raise SubjectNotFound(f"Subject '{subject}' not found.")
        return chosen

    def version(self, subject: str, raw: str, *, deleted: bool = False) -> SubjectVersion:
        """One version (``latest``/-1 for the newest visible one).

        Raises:
            InvalidVersion, SubjectNotFound, VersionNotFound.
        """
        number = parse_version(raw)
        visible = self.versions(subject, deleted=deleted)
        if number == -1:
            return visible[-1]
        for v in visible:
            if v.version == number:
                return v
        raise VersionNotFound(f"Version {number} not found.")

    def delete_subject(self, subject: str, *, permanent: bool = False) -> list[int]:
        """Soft-delete every version, or purge a soft-deleted subject; the versions affected.

        Raises:
            SubjectNotFound, SubjectSoftDeleted, SubjectNotSoftDeleted, OperationNotPermitted.
        """
        self._writable(subject)

        def soft_deleted(every: Sequence[SubjectVersion]) -> None:
            if not every:
                raise SubjectNotFound(f"Subject '{subject}' not found.")
            if any(not v.deleted for v in every):
                raise SubjectNotSoftDeleted(
                    f"Subject '{subject}' was not deleted first before being permanently deleted"
                )

        if permanent:
            # One step with registrations: one that comes after (and its settings) is kept.
            return self.store.purge_subject(subject, soft_deleted)
        every = self.store.versions(subject)
        if not every:
            raise SubjectNotFound(f"Subject '{subject}' not found.")
        live = [v.version for v in every if not v.deleted]
        if not live:
            raise SubjectSoftDeleted(
                f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently"
            )
        self.store.mark_deleted(subject, live)
        return live

    def delete_version(self, subject: str, raw: str, *, permanent: bool = False) -> int:
        """Soft-delete one version, or purge a soft-deleted one; its number.

        Raises:
            InvalidVersion, SubjectNotFound, VersionNotFound, VersionSoftDeleted,
            VersionNotSoftDeleted, OperationNotPermitted.
        """
        self._writable(subject)
        number = parse_version(raw)
        every = self.store.versions(subject)
        if not every:
            raise SubjectNotFound(f"Subject '{subject}' not found.")
        live = [v for v in every if not v.deleted]
        if number == -1:
            pool = every if permanent else live
            if not pool:
                raise VersionNotFound(f"Version {raw} not found.")
            target = pool[-1]
        else:
            found = [v for v in every if v.version == number]
            if not found:
                raise VersionNotFound(f"Version {number} not found.")
            target = found[0]
        if permanent:
            if not target.deleted:
                raise VersionNotSoftDeleted(
                    f"Subject '{subject}' Version {target.version} was not deleted first before "
                    "being permanently deleted"
                )
            self.store.purge(subject, [target.version])
        else:
            if target.deleted:
                raise VersionSoftDeleted(
                    f"Subject '{subject}' Version {target.version} was soft deleted.Set "
                    "permanent=true to delete permanently"
                )
            self.store.mark_deleted(subject, [target.version])
        return target.version

    def _writable(self, subject: str) -> None:
        if self.mode(subject) is Mode.READONLY:
            raise OperationNotPermitted(f"Subject {subject} is in read-only mode")

    # -- compatibility and mode ----------------------------------------------------------------

    def compatibility(self, subject: str | None = None) -> Compatibility:
        """The level in force for ``subject`` (or globally)."""
        raw = self.store.get_setting("compatibility", subject) if subject else None
        raw = raw or self.store.get_setting("compatibility", GLOBAL)
        return Compatibility(raw) if raw else self.default_compatibility

    def subject_compatibility(self, subject: str, *, default_to_global: bool) -> Compatibility:
        """The subject's own level (or the global one if ``default_to_global``).

        Raises:
            SubjectConfigNotFound: none set and not ``default_to_global``.
        """
        raw = self.store.get_setting("compatibility", subject)
        if raw:
            return Compatibility(raw)
        if default_to_global:
            return self.compatibility()
        raise SubjectConfigNotFound(
            f"Subject '{subject}' does not have subject-level compatibility configured"
        )

    def set_compatibility(self, subject: str | None, raw: object) -> Compatibility:
        """Set the level for ``subject`` (None: globally).

        Raises:
            InvalidCompatibility: ``raw`` names no level.
        """
        try:
            level = Compatibility(str(raw).upper()) if isinstance(raw, str) else None
        except ValueError:
            level = None
        if level is None:
            raise InvalidCompatibility(
                f"Invalid compatibility level {raw!r}; valid values are "
                + ", ".join(c.value for c in Compatibility)
            )
        self.store.set_setting("compatibility", subject or GLOBAL, level.value)
        return level

    def delete_compatibility(self, subject: str | None) -> Compatibility:
        """Remove the subject's own level and return it (None: the global one, or the default).

        Raises:
            SubjectNotFound: the subject has no level of its own, whether or not it has versions
                (as Confluent answers, 40401).
        """
        if subject:
            removed = self.store.delete_setting("compatibility", subject)
            if removed is None:
                raise SubjectNotFound(f"Subject '{subject}' not found.")
            return Compatibility(removed)
        before = self.compatibility()
        self.store.delete_setting("compatibility", GLOBAL)
        return before

    def mode(self, subject: str | None = None) -> Mode:
        """The mode in force for ``subject`` (or globally)."""
        raw = self.store.get_setting("mode", subject) if subject else None
        raw = raw or self.store.get_setting("mode", GLOBAL)
        return Mode(raw) if raw else self.default_mode

    def subject_mode(self, subject: str, *, default_to_global: bool) -> Mode:
        """The subject's own mode (or the global one if ``default_to_global``).

        Raises:
            SubjectModeNotFound: none set and not ``default_to_global``.
        """
        raw = self.store.get_setting("mode", subject)
        if raw:
            return Mode(raw)
        if default_to_global:
            return self.mode()
        raise SubjectModeNotFound(
            f"Subject '{subject}' does not have subject-level mode configured"
        )

    def set_mode(self, subject: str | None, raw: object, *, force: bool = False) -> Mode:
        """Set the mode for ``subject`` (None: globally).

        IMPORT needs an empty subject (or registry) unless ``force``.

        Raises:
            InvalidMode: ``raw`` names no mode.
            OperationNotPermitted: IMPORT on a non-empty subject without ``force``.
        """
        try:
            mode = Mode(str(raw).upper()) if isinstance(raw, str) else None
        except ValueError:
            mode = None
        if mode is None:
            raise InvalidMode(f"Invalid mode {raw!r}; valid values are READWRITE, READONLY, IMPORT")
        if mode is Mode.IMPORT and not force:
            not_empty = self.store.versions(subject) if subject else self.store.subjects()
            if not_empty:
                raise OperationNotPermitted(
                    "Cannot import since found existing subjects"
                    if not subject
                    else f"Cannot import since subject {subject} has versions"
                )
        self.store.set_setting("mode", subject or GLOBAL, mode.value)
        return mode

    def delete_mode(self, subject: str) -> Mode:
        """Remove the subject's own mode and return it.

        Raises:
            SubjectNotFound: the subject has no mode of its own, whether or not it has versions
                (as Confluent answers, 40401).
        """
        removed = self.store.delete_setting("mode", subject)
        if removed is None:
            raise SubjectNotFound(f"Subject '{subject}' not found.")
        return Mode(removed)


def require_text(value: object, what: str = "schema") -> str:
    """``value`` if it is a non-empty string; else InvalidSchema naming ``what``."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidSchema(f"Invalid schema: '{what}' must be a non-empty string")
    return value
