"""A schema stored by a release without the default step bound stays usable, on both stores.

The bound (MAX_DEFAULT_STEPS) refuses new schemas whose defaults take too many comparisons
to check; an array default of 340 000 numbers in a ``["null", "int"]`` array (680 KB, under
the 1 MiB body cap) takes about a million. The release before the bound registered such a
schema; after an upgrade, its subject must still answer lookups and idempotent registrations,
accept compatible new versions (whose check re-reads the stored one), and consumers must
still decode messages written with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from pipeline.registry import canonical
from pipeline.registry.canonical import MAX_DEFAULT_STEPS, parse
from pipeline.registry.cli import standalone
from pipeline.registry.client.http import RegistryClient
from pipeline.registry.client.serde import AvroDeserializer
from pipeline.registry.errors import InvalidSchema
from pipeline.registry.stores.protocol import RegistryStore, SubjectVersion

MEDIA_TYPE = "application/vnd.schemaregistry.v1+json"
ITEMS = 340_000


def heavy_schema(extra: bool = False) -> str:
    """A record whose array default takes three comparisons per item (union, null, int)."""
    fields: list[dict[str, object]] = [
        {"name": "d", "type": {"type": "array", "items": ["null", "int"]}, "default": [0] * ITEMS}
    ]
    if extra:
        fields.append({"name": "e", "type": "int", "default": 1})
    return json.dumps({"type": "record", "name": "Top", "fields": fields}, separators=(",", ":"))


def post(url: str, schema_text: str) -> httpx.Response:
    """POST a body carrying ``schema_text``."""
    body = json.dumps({"schema": schema_text}).encode()
    return httpx.post(url, content=body, headers={"Content-Type": MEDIA_TYPE}, timeout=120)


def no_check(live: object) -> None:
    """A store gate that lets the version in (the compatibility check is not the point)."""


@pytest.fixture
def stored(store: RegistryStore, monkeypatch: pytest.MonkeyPatch) -> SubjectVersion:
    """heavy_schema() stored under subject s as the release before the bound stored it."""
    with monkeypatch.context() as unbounded:
        unbounded.setattr(canonical, "MAX_DEFAULT_STEPS", 100 * MAX_DEFAULT_STEPS)
        parsed = parse(heavy_schema())
    return store.register("s", parsed, no_check)


def test_the_schema_is_past_the_bound_for_a_new_registration(registry_url: str) -> None:
    """The premise: registered afresh, it is refused with the step bound."""
    with pytest.raises(InvalidSchema, match="steps"):
        parse(heavy_schema())
    answer = post(f"{registry_url}/subjects/t/versions", heavy_schema())
    assert (answer.status_code, answer.json()["error_code"]) == (422, 42201), answer.text


def test_a_stored_costly_schema_is_looked_up_and_registered_again(
    registry_url: str, stored: SubjectVersion
) -> None:
    """Lookup and an idempotent registration (a serializer's start) find the stored version."""
    found = post(f"{registry_url}/subjects/s", heavy_schema())
    assert found.status_code == 200, found.text[:300]
    assert (found.json()["id"], found.json()["version"]) == (stored.schema_id, stored.version)
    again = post(f"{registry_url}/subjects/s/versions", heavy_schema())
    assert again.json() == {"id": stored.schema_id}, again.text[:300]


def test_a_new_version_is_checked_against_a_stored_costly_schema(
    registry_url: str, stored: SubjectVersion
) -> None:
    """A compatible small schema after it registers: the check reads the stored one again."""
    small = json.dumps({"type": "record", "name": "Top", "fields": []})
    tested = post(f"{registry_url}/compatibility/subjects/s/versions/latest", small)
    assert tested.json() == {"is_compatible": True}, tested.text[:300]
    answer = post(f"{registry_url}/subjects/s/versions", small)
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["id"] != stored.schema_id


def test_a_message_written_with_a_stored_costly_schema_is_decoded(
    registry_url: str, stored: SubjectVersion
) -> None:
    """The deserializer parses the writer schema fetched by id: ``{"d": []}`` comes back."""
    client = RegistryClient(registry_url)
    try:
        framed = b"\x00" + stored.schema_id.to_bytes(4, "big") + b"\x00"
        assert AvroDeserializer(client).deserialize(framed) == {"d": []}
    finally:
        client.close()


def test_a_costly_schema_a_subject_lacks_is_not_found_there(
    registry_url: str, stored: SubjectVersion
) -> None:
    """A lookup compares fingerprints: one the subject does not hold is 40403, 40401 without it."""
    elsewhere = post(f"{registry_url}/subjects/s", heavy_schema(extra=True))
    assert (elsewhere.status_code, elsewhere.json()["error_code"]) == (404, 40403)
    nowhere = post(f"{registry_url}/subjects/nobody", heavy_schema())
    assert (nowhere.status_code, nowhere.json()["error_code"]) == (404, 40401)


def test_schemas_check_of_a_stored_costly_schema_says_unchanged(
    registry_url: str, store: RegistryStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The operator's own files are read unbounded: the registry says whether it holds them."""
    with monkeypatch.context() as unbounded:
        unbounded.setattr(canonical, "MAX_DEFAULT_STEPS", 100 * MAX_DEFAULT_STEPS)
        store.register("Top", parse(heavy_schema()), no_check)
    folder = tmp_path / "schemas"
    folder.mkdir()
    (folder / "top.avsc").write_text(heavy_schema())
    # The costly lookup takes seconds of the server's CPU: on a loaded machine the client's
    # default 10 s would decide the test, not the answer.
    monkeypatch.setenv("PIPELINE_REGISTRY__TIMEOUT_S", "120")
    result = CliRunner().invoke(
        standalone(), ["schemas", "check", str(folder), "--url", registry_url]
    )
    assert result.exit_code == 0, result.output
    assert "top.avsc: Top: unchanged" in result.output
