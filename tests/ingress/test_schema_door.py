"""Validation at the door: a lane's payloads must match its registered schema, or get a 400."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from ingress.helpers import META, build, client, meta_body
from ingress.signing import hub_signature

from pipeline.ingress.errors import SchemaMismatch
from pipeline.ingress.schemas import LaneSchemas
from pipeline.logstore import Selection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.registry.client.http import RegistryClient
from pipeline.registry.server.api import create_app
from pipeline.registry.server.serve import BackgroundServer
from pipeline.registry.stores.sqlite.store import SqliteSchemaStore

TOPICS = {"messages": "messages", "engagement": "engagement"}
SECRET = "meta-app-secret"  # noqa: S105 - a test secret
# The part of a WhatsApp payload the messages lane relies on.
SCHEMA = {
    "type": "record",
    "name": "WhatsAppDelivery",
    "namespace": "test.door",
    "fields": [
        {"name": "object", "type": "string"},
        {
            "name": "entry",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Entry",
                    "fields": [{"name": "id", "type": "string"}],
                },
            },
        },
    ],
}


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RegistryClient]:
    """A client of a real registry server holding the messages lane's schema."""
    store = SqliteSchemaStore(str(tmp_path / "registry.db"))
    with BackgroundServer(create_app(store)) as server:
        registry = RegistryClient(server.url)
        registry.register("messages-value", json.dumps(SCHEMA))
        yield registry
        registry.close()
    store.close()


def signed(body: bytes) -> dict[str, str]:
    """Headers of a Meta delivery of ``body``."""
    return {"x-hub-signature-256": hub_signature(SECRET, body), "content-type": "application/json"}


async def test_a_payload_that_does_not_match_is_refused_with_the_field_at_fault(
    tmp_path: Path, sqlite_store: SqliteLogStore, registry: RegistryClient
) -> None:
    """A matching payload is accepted; one missing a required field gets 400 and is not stored."""
    app, http = client(build(tmp_path, {"whatsapp": META}, TOPICS), sqlite_store)
    app.schemas = LaneSchemas(registry, {"messages": "messages-value"})
    await app.schemas.start()
    good = meta_body(1)
    document = json.loads(meta_body(2))
    document["object"] = 7  # a number where the schema wants a string
    bad = json.dumps(document).encode()
    async with http:
        accepted = await http.post("/hooks/whatsapp", content=good, headers=signed(good))
        refused = await http.post("/hooks/whatsapp", content=bad, headers=signed(bad))
    await app.schemas.close()
    assert accepted.status_code == 200
    assert refused.status_code == 400
    assert refused.json()["error"] == "schema mismatch"
    assert "object" in refused.json()["detail"]
    assert len(await sqlite_store.select(Selection(), limit=10)) == 1


async def test_an_unknown_subject_leaves_its_lane_unchecked(
    tmp_path: Path, sqlite_store: SqliteLogStore, registry: RegistryClient
) -> None:
    """A subject the registry does not have is not enforced: webhooks are never lost to it."""
    app, http = client(build(tmp_path, {"whatsapp": META}, TOPICS), sqlite_store)
    app.schemas = LaneSchemas(registry, {"messages": "no-such-subject"})
    await app.schemas.start()
    body = meta_body(1)
    async with http:
        response = await http.post("/hooks/whatsapp", content=body, headers=signed(body))
    await app.schemas.close()
    assert response.status_code == 200


class _Latest:
    """A registry answer: the subject's latest schema text."""

    def __init__(self, schema: str) -> None:
        self.schema = schema


class _Registry:
    """A registry that accepted a schema fastavro refuses, as Confluent's accepts a bad default."""

    def __init__(self, schemas: dict[str, dict[str, object]]) -> None:
        self._schemas = schemas

    def latest(self, subject: str) -> _Latest:
        return _Latest(json.dumps(self._schemas[subject]))


async def test_a_schema_that_cannot_be_parsed_leaves_its_lane_unchecked_and_the_rest_loaded() -> (
    None
):
    """An invalid default: logged, that lane not validated, the next subjects still loaded.

    fastavro's parse error is no ValueError: it escaped the refresh, so the ingress refused to
    start, or a later refresh ended and every lane kept its old schema.
    """
    bad = {
        "type": "record",
        "name": "Bad",
        "fields": [{"name": "a", "type": "string", "default": None}],
    }
    registry = _Registry({"bad-value": bad, "messages-value": SCHEMA})
    schemas = LaneSchemas(
        registry,  # type: ignore[arg-type]
        {"engagement": "bad-value", "messages": "messages-value"},
    )
    await schemas.start()
    try:
        schemas.check("engagement", b"{}")  # not validated
        with pytest.raises(SchemaMismatch):
            schemas.check("messages", b'{"object": 7, "entry": []}')
    finally:
        await schemas.close()
