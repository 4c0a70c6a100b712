"""The REST API as confluent-kafka's SchemaRegistryClient uses it, on both stores."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from pipeline.registry.canonical import parse

MEDIA_TYPE = "application/vnd.schemaregistry.v1+json"


def avro(name: str = "User", *fields: tuple[str, Any, Any], namespace: str = "test") -> Schema:
    """An Avro record schema; each field is (name, type, default or ...)."""
    body = {
        "type": "record",
        "name": name,
        "namespace": namespace,
        "fields": [
            {"name": n, "type": t, **({} if d is ... else {"default": d})} for n, t, d in fields
        ],
    }
    return Schema(json.dumps(body), "AVRO")


V1 = avro("User", ("id", "long", ...))
V2 = avro("User", ("id", "long", ...), ("email", ["null", "string"], None))
BREAKS_V2 = avro("User", ("id", "long", ...), ("age", "int", ...))


def error_of(call: Any) -> SchemaRegistryError:
    """The SchemaRegistryError ``call()`` raises."""
    with pytest.raises(SchemaRegistryError) as info:
        call()
    return info.value


def test_register_is_idempotent_and_ids_are_global(sr_client: SchemaRegistryClient) -> None:
    """Re-registering, or registering a reformatted copy elsewhere, returns the same id."""
    first = sr_client.register_schema("users-value", V1)
    assert sr_client.register_schema("users-value", V1) == first
    reordered = json.dumps(
        {
            "fields": [{"type": {"type": "long"}, "name": "id"}],
            "name": "test.User",
            "type": "record",
        }
    )
    fresh = SchemaRegistryClient({"url": sr_client.config()["url"]})
    assert fresh.register_schema("other-value", Schema(reordered, "AVRO")) == first
    assert fresh.get_versions("users-value") == [1]
    second = fresh.register_schema("users-value", V2)
    assert second != first
    assert fresh.get_versions("users-value") == [1, 2]
    fresh.close()


def test_lookup_reports_subject_version_and_id(sr_client: SchemaRegistryClient) -> None:
    """POST /subjects/{s} finds the version holding a schema, or says which part is missing."""
    schema_id = sr_client.register_schema("orders-value", V1)
    found = sr_client.lookup_schema("orders-value", V1)
    assert (found.subject, found.version, found.schema_id) == ("orders-value", 1, schema_id)
    assert error_of(lambda: sr_client.lookup_schema("orders-value", V2)).error_code == 40403
    assert error_of(lambda: sr_client.lookup_schema("nobody-value", V1)).error_code == 40401


def test_versions_latest_and_schema_by_id(sr_client: SchemaRegistryClient) -> None:
    """Versions list, latest, a version by number and a schema by id agree with each other."""
    id1 = sr_client.register_schema("u-value", V1)
    id2 = sr_client.register_schema("u-value", V2)
    latest = sr_client.get_latest_version("u-value")
    assert (latest.version, latest.schema_id) == (2, id2)
    v1 = sr_client.get_version("u-value", 1)
    assert v1.schema_id == id1
    assert json.loads(v1.schema.schema_str)["name"] == "test.User"
    by_id = sr_client.get_schema(id2, subject_name="u-value")
    assert parse(by_id.schema_str).fingerprint == parse(latest.schema.schema_str).fingerprint
    versions = sr_client.get_schema_versions(id1)
    assert [(v.subject, v.version) for v in versions] == [("u-value", 1)]
    assert sr_client.get_subjects_by_schema_id(id1) == ["u-value"]
    assert sr_client.get_schema_types() == ["AVRO"]
    assert sr_client.get_referenced_by("u-value", 1) == []
    assert error_of(lambda: sr_client.get_version("u-value", 7)).error_code == 40402
    assert error_of(lambda: sr_client.get_schema(9999)).error_code == 40403


def test_subjects_are_url_encoded_and_filtered_by_prefix(sr_client: SchemaRegistryClient) -> None:
    """Subjects with '/', spaces and '%' round-trip; subjectPrefix filters the list."""
    odd = "team/a b%c-value"
    sr_client.register_schema(odd, V1)
    sr_client.register_schema("team-x-value", V1)
    sr_client.register_schema("zeta-value", V1)
    assert sr_client.get_versions(odd) == [1]
    assert sr_client.get_latest_version(odd).subject == odd
    assert sr_client.get_subjects() == ["team-x-value", "team/a b%c-value", "zeta-value"]
    assert sr_client.get_subjects(subject_prefix="team") == ["team-x-value", odd]


def test_incompatible_schema_is_refused_with_409(sr_client: SchemaRegistryClient) -> None:
    """Under BACKWARD a new required field is refused with 409 naming the field and the rule."""
    sr_client.register_schema("c-value", V1)
    sr_client.register_schema("c-value", V2)
    failure = error_of(lambda: sr_client.register_schema("c-value", BREAKS_V2))
    assert failure.http_status_code == 409
    assert failure.error_code == 409
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in failure.error_message
    assert "User.age" in failure.error_message
    assert sr_client.get_versions("c-value") == [1, 2]


def test_compatibility_endpoint_is_verbose(sr_client: SchemaRegistryClient) -> None:
    """POST /compatibility returns is_compatible, and messages when verbose."""
    sr_client.register_schema("t-value", V1)
    assert sr_client.test_compatibility("t-value", V2) is True
    assert sr_client.test_compatibility("t-value", BREAKS_V2, version=1) is False
    assert sr_client.test_compatibility_all_versions("t-value", V2) is True
    raw = httpx.post(
        f"{sr_client.config()['url']}/compatibility/subjects/t-value/versions/latest?verbose=True",
        json={"schema": BREAKS_V2.schema_str},
    ).json()
    assert raw["is_compatible"] is False
    assert any("User.age" in m and "READER_FIELD_MISSING" in m for m in raw["messages"])


def test_soft_then_permanent_delete_of_a_subject(sr_client: SchemaRegistryClient) -> None:
    """A subject is soft-deleted first (hidden, id still resolvable), then purged for good."""
    schema_id = sr_client.register_schema("d-value", V1)
    assert error_of(lambda: sr_client.delete_subject("d-value", permanent=True)).error_code == 40405
    assert sr_client.delete_subject("d-value") == [1]
    assert error_of(lambda: sr_client.delete_subject("d-value")).error_code == 40404
    assert "d-value" not in sr_client.get_subjects()
    assert sr_client.get_subjects(deleted=True) == ["d-value"]
    assert error_of(lambda: sr_client.get_versions("d-value")).error_code == 40401
    assert sr_client.get_versions("d-value", deleted=True) == [1]
    assert sr_client.get_version("d-value", 1, deleted=True).schema_id == schema_id
    assert sr_client.lookup_schema("d-value", V1, deleted=True).version == 1
    assert sr_client.delete_subject("d-value", permanent=True) == [1]
    assert sr_client.get_subjects(deleted=True) == []
    fresh = SchemaRegistryClient({"url": sr_client.config()["url"]})
    assert json.loads(fresh.get_schema(schema_id).schema_str)["name"] == "test.User"
    assert fresh.register_schema("d-value", V1) == schema_id
    assert fresh.get_versions("d-value") == [1]
    fresh.close()


def test_soft_then_permanent_delete_of_a_version(sr_client: SchemaRegistryClient) -> None:
    """Deleting a version hides it from compatibility checks; versions keep their numbers."""
    sr_client.register_schema("v-value", V1)
    sr_client.register_schema("v-value", V2)
    assert (
        error_of(lambda: sr_client.delete_version("v-value", 2, permanent=True)).error_code == 40407
    )
    assert sr_client.delete_version("v-value", 2) == 2
    assert error_of(lambda: sr_client.delete_version("v-value", 2)).error_code == 40406
    assert sr_client.get_versions("v-value") == [1]
    assert sr_client.get_versions("v-value", deleted_only=True) == [2]
    assert sr_client.get_latest_version("v-value").version == 1
    assert sr_client.delete_version("v-value", 2, permanent=True) == 2
    assert sr_client.get_versions("v-value", deleted=True) == [1]
    sr_client.clear_caches()  # the client remembers it registered V2 and would not ask again
    sr_client.register_schema("v-value", V2)
    assert sr_client.get_versions("v-value") == [1, 2]


def test_global_and_subject_config(sr_client: SchemaRegistryClient) -> None:
    """Compatibility is set globally or per subject; a subject without one answers 40408."""
    assert sr_client.get_compatibility() == "BACKWARD"
    assert error_of(lambda: sr_client.get_compatibility("k-value")).error_code == 40408
    url = sr_client.config()["url"]
    fallback = httpx.get(f"{url}/config/k-value", params={"defaultToGlobal": "true"}).json()
    assert fallback == {"compatibilityLevel": "BACKWARD"}
    sr_client.register_schema("k-value", V1)
    assert sr_client.set_compatibility("k-value", "none") == {"compatibility": "NONE"}
    assert sr_client.get_compatibility("k-value") == "NONE"
    sr_client.register_schema("k-value", BREAKS_V2)  # allowed under NONE
    assert sr_client.delete_config("k-value").compatibility_level.value == "NONE"
    assert sr_client.set_compatibility(level="FULL_TRANSITIVE") == {
        "compatibility": "FULL_TRANSITIVE"
    }
    assert sr_client.get_config().compatibility_level.value == "FULL_TRANSITIVE"
    assert error_of(lambda: sr_client.set_compatibility(level="SIDEWAYS")).error_code == 42203
    sr_client.delete_config()
    assert sr_client.get_compatibility() == "BACKWARD"


def test_modes_readonly_and_import(sr_client: SchemaRegistryClient) -> None:
    """READONLY refuses writes (42205); IMPORT keeps a given id and version."""
    assert sr_client.get_global_mode() == "READWRITE"
    sr_client.register_schema("m-value", V1)
    assert sr_client.update_mode("m-value", "READONLY") == "READONLY"
    assert sr_client.get_mode("m-value") == "READONLY"
    assert error_of(lambda: sr_client.register_schema("m-value", V2)).error_code == 42205
    assert error_of(lambda: sr_client.delete_subject("m-value")).error_code == 42205
    assert sr_client.delete_mode("m-value") == "READONLY"
    assert error_of(lambda: sr_client.get_mode("m-value")).error_code == 40409
    assert error_of(lambda: sr_client.update_mode("m-value", "IMPORT")).error_code == 42205
    assert error_of(lambda: sr_client.update_global_mode("SLEEPY")).error_code == 42204
    assert sr_client.update_mode("imported-value", "IMPORT") == "IMPORT"
    url = sr_client.config()["url"]
    answer = httpx.post(
        f"{url}/subjects/imported-value/versions",
        json={"schema": V2.schema_str, "id": 4242, "version": 7},
    )
    assert answer.json() == {"id": 4242}
    assert sr_client.get_version("imported-value", 7).schema_id == 4242
    plain = httpx.post(f"{url}/subjects/m-value/versions", json={"schema": V2.schema_str, "id": 5})
    assert plain.json()["error_code"] == 42205
    after = sr_client.register_schema("later-value", BREAKS_V2)
    assert after > 4242


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b"{}", "'schema' must be a non-empty string"),
        (b'{"schema": 42}', "'schema' must be a non-empty string"),
        (b'{"schema": "{\\"type\\": \\"record\\"}"}', "Invalid schema"),
        (b'{"schema": "not json at all"}', "not valid JSON"),
        (b'{"schema": "\\"Nope\\""}', "unknown type"),
        (b'{"schema": "{\\"type\\":\\"enum\\",\\"name\\":\\"E\\",\\"symbols\\":[1]}"}', "symbols"),
        (b'{"schema": "\\"int\\"", "schemaType": "PROTOBUF"}', "not supported"),
        (b'{"schema": "\\"int\\"", "references": [{"name": "x"}]}', "references"),
        (b'{"schema": "\\"int\\"", "id": "seven"}', "positive integer"),
    ],
)
def test_malformed_requests_answer_42201(registry_url: str, body: bytes, reason: str) -> None:
    """Malformed bodies and schemas answer 422/42201 with the reason, never a 500."""
    paths = ["/subjects/bad-value/versions"]
    if b'"id"' not in body:  # lookup ignores an id
        paths += ["/subjects/bad-value", "/compatibility/subjects/bad-value/versions"]
    for path in paths:
        answer = httpx.post(registry_url + path, content=body, headers={"Content-Type": MEDIA_TYPE})
        assert answer.status_code == 422, answer.text
        assert answer.headers["content-type"].startswith(MEDIA_TYPE)
        assert answer.json()["error_code"] == 42201
        assert reason in answer.json()["message"]


def test_invalid_version_unknown_routes_and_associations(registry_url: str) -> None:
    """Bad versions give 42202, unknown paths a JSON 404, and the associations probe 404."""
    httpx.post(f"{registry_url}/subjects/x-value/versions", json={"schema": '"int"'})
    for bad in ("0", "-2", "abc", "99999999999"):
        answer = httpx.get(f"{registry_url}/subjects/x-value/versions/{bad}")
        assert (answer.status_code, answer.json()["error_code"]) == (422, 42202)
    assert httpx.get(f"{registry_url}/subjects/x-value/versions/-1").json()["version"] == 1
    missing = httpx.get(f"{registry_url}/nowhere")
    assert (missing.status_code, missing.json()["error_code"]) == (404, 404)
    probe = httpx.get(
        f"{registry_url}/associations/resources/-/orders",
        params={"resourceType": "topic", "associationType": "value"},
    )
    assert probe.status_code == 404
    assert httpx.get(f"{registry_url}/schemas/ids/abc").json()["error_code"] == 40403
