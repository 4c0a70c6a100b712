"""Permanent deletes interleaved with registrations and settings, on both stores.

A permanent delete reads the subject before it removes anything; these tests run another
request at exactly that point (a hook on the real store's read), so the interleavings that
concurrent HTTP requests hit only now and then happen every time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pipeline.config import Compatibility
from pipeline.registry.server.service import Registry
from pipeline.registry.stores.protocol import RegistryStore, SubjectVersion


def _record(field: str) -> str:
    return json.dumps(
        {"type": "record", "name": "R", "fields": [{"name": field, "type": "int", "default": 0}]}
    )


class _AfterRead:
    """Delegates to a real store; once armed, runs ``then`` right after the next versions read."""

    def __init__(self, store: RegistryStore) -> None:
        self._store = store
        self.then: Callable[[], None] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def versions(self, subject: str) -> list[SubjectVersion]:
        read = self._store.versions(subject)
        then, self.then = self.then, None
        if then is not None:
            then()
        return read


def test_permanent_subject_delete_keeps_a_registration_and_config_made_after_its_read(
    store: RegistryStore,
) -> None:
    """A registration and config set while a permanent subject delete runs are kept whole."""
    hooked = _AfterRead(store)
    registry = Registry(hooked)  # type: ignore[arg-type]
    registry.register("s", _record("a"))
    registry.delete_subject("s")
    registered: list[SubjectVersion] = []

    def register_then_configure() -> None:
        registered.append(registry.register("s", _record("b")))
        registry.set_compatibility("s", "NONE")

    hooked.then = register_then_configure
    registry.delete_subject("s", permanent=True)
    if hooked.then is not None:  # the delete never read outside its own step: run them after
        register_then_configure()

    assert registry.subject_compatibility("s", default_to_global=False) is Compatibility.NONE
    found = registry.lookup("s", _record("b"))
    assert (found.version, found.schema_id) == (registered[0].version, registered[0].schema_id)
    assert found.version == 1  # registered after the delete, so the subject starts again at 1


def test_permanent_version_delete_never_removes_a_live_version(store: RegistryStore) -> None:
    """Two permanent deletes of one number with a registration between keep the new version."""
    hooked = _AfterRead(store)
    registry = Registry(hooked)  # type: ignore[arg-type]
    registry.set_compatibility("s", "NONE")
    registry.register("s", _record("a"))
    registry.register("s", _record("b"))
    registry.delete_version("s", "2")
    registered: list[SubjectVersion] = []

    def purge_then_register() -> None:
        registry.delete_version("s", "2", permanent=True)
        registered.append(registry.register("s", _record("c")))

    hooked.then = purge_then_register
    registry.delete_version("s", "2", permanent=True)

    assert registered[0].version == 2
    assert registry.lookup("s", _record("c")).version == 2
    assert [v.version for v in registry.versions("s")] == [1, 2]
