"""The registry store contract: one body of tests every RegistryStore passes, through the protocol.

Subclassed per store in ``test_sqlite.py`` and ``test_postgres.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from registry.stores import open_test_store

from pipeline.registry.canonical import parse
from pipeline.registry.errors import IdConflict, IncompatibleSchema, SchemaIdTaken
from pipeline.registry.stores.protocol import GLOBAL, RegistryStore, SubjectVersion

A = parse('{"type": "record", "name": "A", "fields": [{"name": "x", "type": "int"}]}')
B = parse('{"type": "record", "name": "B", "fields": [{"name": "y", "type": "int"}]}')


def allow(_live: object) -> None:
    """A check that accepts every schema."""


class RegistryStoreContract:
    """The RegistryStore protocol's contract; a subclass per database names it in ``kind``."""

    kind: ClassVar[str]

    @pytest.fixture
    def store(self, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RegistryStore]:
        """The subclass's store, empty."""
        yield from open_test_store(self.kind, request, tmp_path)

    def test_register_is_idempotent_and_ids_are_global(self, store: RegistryStore) -> None:
        """The same schema gets one id across subjects, and re-registering changes nothing."""
        first = store.register("s1", A, allow)
        assert (first.version, first.deleted) == (1, False)
        assert store.register("s1", A, allow) == first
        other = store.register("s2", A, allow)
        assert other.schema_id == first.schema_id
        assert store.register("s1", B, allow).version == 2
        stored = store.schema(first.schema_id)
        assert stored is not None
        assert stored.schema == A.normalized
        assert store.schema(999_999) is None
        assert [v.subject for v in store.usages(first.schema_id)] == ["s1", "s2"]
        assert store.subjects() == {"s1": False, "s2": False}

    def test_check_sees_live_versions_and_can_refuse(self, store: RegistryStore) -> None:
        """The check gets the live versions oldest first; raising from it appends nothing."""
        store.register("s", A, allow)
        seen: list[list[int]] = []

        def refuse(live: list[SubjectVersion]) -> None:
            seen.append([v.version for v in live])
            raise IncompatibleSchema("no")

        with pytest.raises(IncompatibleSchema):
            store.register("s", B, refuse)  # type: ignore[arg-type]
        assert seen == [[1]]
        assert [v.version for v in store.versions("s")] == [1]

    def test_soft_delete_and_purge_keep_numbers_and_ids(self, store: RegistryStore) -> None:
        """Soft-deleted versions keep their number; purged ones free it, and ids stay valid."""
        a = store.register("s", A, allow)
        store.register("s", B, allow)
        store.mark_deleted("s", [2])
        assert [(v.version, v.deleted) for v in store.versions("s")] == [(1, False), (2, True)]
        assert store.register("s", B, allow).version == 3  # a deleted version is not reused
        store.mark_deleted("s", [1, 3])
        assert store.subjects() == {"s": True}
        store.purge("s", [1, 2, 3])
        assert store.versions("s") == []
        assert store.subjects() == {}
        assert store.schema(a.schema_id) is not None
        assert store.register("s", A, allow).schema_id == a.schema_id

    def test_import_keeps_given_ids_and_refuses_conflicts(self, store: RegistryStore) -> None:
        """Given ids and versions are kept; generated ids continue above them; clashes refused."""
        imported = store.register("s", A, allow, schema_id=500, version=10)
        assert (imported.schema_id, imported.version) == (500, 10)
        with pytest.raises(
            SchemaIdTaken, match="Overwrite new schema with id 500 is not permitted"
        ):
            store.register("t", B, allow, schema_id=500)
        with pytest.raises(IdConflict):
            store.register("t", A, allow, schema_id=501)
        assert store.register("t", B, allow).schema_id > 500

    def test_settings_per_subject_and_global(self, store: RegistryStore) -> None:
        """Settings are kept per kind and subject, replaced in place, deleted with their value."""
        assert store.get_setting("compatibility", GLOBAL) is None
        store.set_setting("compatibility", GLOBAL, "FULL")
        store.set_setting("compatibility", "s", "NONE")
        store.set_setting("compatibility", "s", "FORWARD")
        store.set_setting("mode", "s", "READONLY")
        assert store.get_setting("compatibility", GLOBAL) == "FULL"
        assert store.get_setting("compatibility", "s") == "FORWARD"
        assert store.get_setting("mode", "s") == "READONLY"
        assert store.delete_setting("compatibility", "s") == "FORWARD"
        assert store.delete_setting("compatibility", "s") is None
        assert store.get_setting("mode", "s") == "READONLY"
