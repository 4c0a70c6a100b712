"""Errors of the schema registry, each carrying the Confluent error code it answers with.

They extend the project's tree (:mod:`pipeline.errors`) with one branch::

    PipelineError
    └── RegistryError                 a registry operation failed (http_status, error_code)
        ├── SubjectNotFound           40401
        ├── VersionNotFound           40402
        ├── SchemaNotFound            40403 (also a deserializer's: a message's schema id the
        │                                    registry lacks, named with its URL; retried)
        ├── SubjectSoftDeleted        40404 (soft-deleting twice)
        ├── SubjectNotSoftDeleted     40405 (permanent delete before the soft one)
        ├── VersionSoftDeleted        40406
        ├── VersionNotSoftDeleted     40407
        ├── SubjectConfigNotFound     40408 (no subject-level compatibility)
        ├── SubjectModeNotFound       40409 (no subject-level mode)
        ├── IncompatibleSchema        409   (the compatibility rules refused the schema)
        ├── InvalidSchema             42201 (malformed JSON body, or not a valid Avro schema)
        │   └── DefaultsTooCostly     42201 (its field defaults take too many steps to check)
        ├── InvalidVersion            42202
        ├── InvalidSubject            42208 (a control character in the name, or over 2 KiB)
        ├── InvalidCompatibility      42203
        ├── InvalidMode               42204
        ├── OperationNotPermitted     42205 (READONLY / IMPORT mode rules)
        │   └── SchemaIdTaken         42205 (IMPORT with an id that holds another schema)
        ├── IdConflict                42207 (IMPORT of a schema under a second id, or of a
        │                                    version number the subject has)
        ├── StoreError                50001 (the database failed; translated from sqlite3/psycopg)
        ├── Unauthorized              401   (missing or wrong credentials)
        ├── Forbidden                 403   (a read-only principal tried to write)
        └── SerdeError                a client-side failure: wire format, HTTP, encoding
            └── RegistryUnreachable   the registry did not answer (refused, timed out)

The API turns every :class:`RegistryError` into the Confluent body
``{"error_code": ..., "message": ...}`` with :attr:`RegistryError.http_status`.
"""

from __future__ import annotations

from typing import ClassVar

from pipeline.errors import PipelineError

MAX_MESSAGE_CHARS = 1000
"""Longest text an error answer echoes in one piece: messages echo what the client sent (a
name, a subject, a version, a level), and a 400 000-character name came back whole."""


def cut_middle(text: str, most: int = MAX_MESSAGE_CHARS) -> str:
    """``text``, its middle left out past ``most`` characters (its end is often the reason)."""
    if len(text) <= most:
        return text
    half = most // 2
    left_out = len(text) - 2 * half
    return f"{text[:half]}...({left_out} characters left out)...{text[-half:]}"


class RegistryError(PipelineError):
    """A registry operation failed; ``error_code`` is the Confluent code sent to clients."""

    http_status: ClassVar[int] = 500
    error_code: ClassVar[int] = 50001


class SubjectNotFound(RegistryError):
    """The subject has no (visible) versions."""

    http_status = 404
    error_code = 40401


class VersionNotFound(RegistryError):
    """The subject has no such (visible) version."""

    http_status = 404
    error_code = 40402


class SchemaNotFound(RegistryError):
    """No schema has this id, or the subject does not hold this schema."""

    http_status = 404
    error_code = 40403


class SubjectSoftDeleted(RegistryError):
    """The subject is already soft-deleted; delete it with ``permanent=true``."""

    http_status = 404
    error_code = 40404


class SubjectNotSoftDeleted(RegistryError):
    """A permanent delete needs a soft delete first."""

    http_status = 404
    error_code = 40405


class VersionSoftDeleted(RegistryError):
    """The version is already soft-deleted; delete it with ``permanent=true``."""

    http_status = 404
    error_code = 40406


class VersionNotSoftDeleted(RegistryError):
    """A permanent delete of a version needs a soft delete first."""

    http_status = 404
    error_code = 40407


class SubjectConfigNotFound(RegistryError):
    """The subject has no subject-level compatibility (ask with ``defaultToGlobal=true``)."""

    http_status = 404
    error_code = 40408


class SubjectModeNotFound(RegistryError):
    """The subject has no subject-level mode (ask with ``defaultToGlobal=true``)."""

    http_status = 404
    error_code = 40409


class IncompatibleSchema(RegistryError):
    """The schema breaks the subject's compatibility level; the message lists each rule broken."""

    http_status = 409
    error_code = 409


class InvalidSchema(RegistryError):
    """The request body or the schema in it is malformed; the message says why."""

    http_status = 422
    error_code = 42201


class InvalidVersion(RegistryError):
    """A version is neither a positive integer, ``-1`` nor ``latest``."""

    http_status = 422
    error_code = 42202


class InvalidCompatibility(RegistryError):
    """An unknown compatibility level was given."""

    http_status = 422
    error_code = 42203


class InvalidSubject(RegistryError):
    """A subject Confluent will not create: its name holds a control character (42208)."""

    http_status = 422
    error_code = 42208


class InvalidMode(RegistryError):
    """An unknown mode was given."""

    http_status = 422
    error_code = 42204


class OperationNotPermitted(RegistryError):
    """The subject's mode forbids the operation (READONLY, or an id outside IMPORT)."""

    http_status = 422
    error_code = 42205


class SchemaIdTaken(OperationNotPermitted):
    """An imported id already holds a different schema (Confluent's "Overwrite new schema")."""

    def __init__(self, schema_id: int) -> None:
        """The refusal of an import of ``schema_id``, in Confluent's words."""
        super().__init__(f"Overwrite new schema with id {schema_id} is not permitted.")


class IdConflict(RegistryError):
    """An import refused here that Confluent would take (see docs/registry.md).

    A schema this registry holds under another id (it keeps one id per schema), or a version
    number the subject already has (it never overwrites one).
    """

    http_status = 422
    error_code = 42207


class StoreError(RegistryError):
    """The backing database failed; the request may be retried."""

    http_status = 500
    error_code = 50001


class Unauthorized(RegistryError):
    """Credentials are missing or wrong."""

    http_status = 401
    error_code = 40101


class Forbidden(RegistryError):
    """The principal may read but not write."""

    http_status = 403
    error_code = 40301


class SerdeError(RegistryError):
    """Client side: a message could not be encoded or decoded, or the registry was unreachable."""


class RegistryUnreachable(SerdeError):
    """Client side: the registry did not answer (refused, timed out, the connection lost)."""
