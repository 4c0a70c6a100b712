"""Corner cases where the registry answers as Confluent Schema Registry does, on both stores.

Each test names the Confluent behaviour it holds the registry to (``KafkaSchemaRegistry``,
``CompatibilityResource``, ``ConfigResource``, ``ModeResource``, ``VersionId``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError


def avro(*fields: tuple[str, Any]) -> Schema:
    """A ``test.User`` record with these (name, type) fields, none with a default."""
    body = {
        "type": "record",
        "name": "User",
        "namespace": "test",
        "fields": [{"name": n, "type": t} for n, t in fields],
    }
    return Schema(json.dumps(body), "AVRO")


V1 = avro(("id", "long"))
V2 = avro(("id", "long"), ("name", "string"))  # a required field more: BACKWARD refuses it
OTHER = avro(("key", "string"))


def error_of(call: Callable[[], object]) -> SchemaRegistryError:
    """The SchemaRegistryError ``call()`` raises."""
    with pytest.raises(SchemaRegistryError) as info:
        call()
    return info.value


def test_readonly_returns_the_id_of_a_schema_the_subject_already_holds(
    sr_client: SchemaRegistryClient,
) -> None:
    """READONLY refuses new versions only: a schema already live answers its id (lookup first)."""
    schema_id = sr_client.register_schema("ro-value", V1)
    assert sr_client.update_mode("ro-value", "READONLY") == "READONLY"
    sr_client.clear_caches()  # the client remembers V1's id and would not ask the registry again
    assert sr_client.register_schema("ro-value", V1) == schema_id
    url = sr_client.config()["url"]
    again = httpx.post(f"{url}/subjects/ro-value/versions", json={"schema": V1.schema_str})
    assert (again.status_code, again.json()) == (200, {"id": schema_id})
    given = httpx.post(
        f"{url}/subjects/ro-value/versions", json={"schema": V1.schema_str, "id": schema_id}
    )
    assert given.json() == {"id": schema_id}
    # A new version is refused for the mode, before (and whatever) the compatibility check says.
    for schema in (OTHER, V2):
        refused = error_of(lambda s=schema: sr_client.register_schema("ro-value", s))
        assert (refused.http_status_code, refused.error_code) == (422, 42205)
        assert "read-only" in refused.error_message
    # An id other than the one the schema has is not the same registration: refused too.
    other_id = httpx.post(
        f"{url}/subjects/ro-value/versions", json={"schema": V1.schema_str, "id": schema_id + 7}
    )
    assert other_id.json()["error_code"] == 42205
    assert sr_client.get_versions("ro-value") == [1]


def test_an_explicit_id_outside_import_must_be_the_schemas_own(
    sr_client: SchemaRegistryClient,
) -> None:
    """READWRITE: re-sending a held schema with another id is refused (42205), not ignored."""
    schema_id = sr_client.register_schema("rw-value", V1)
    url = sr_client.config()["url"]
    same = httpx.post(
        f"{url}/subjects/rw-value/versions", json={"schema": V1.schema_str, "id": schema_id}
    )
    assert same.json() == {"id": schema_id}
    other = httpx.post(
        f"{url}/subjects/rw-value/versions", json={"schema": V1.schema_str, "id": schema_id + 7}
    )
    assert (other.status_code, other.json()["error_code"]) == (422, 42205)
    assert sr_client.get_versions("rw-value") == [1]


def test_compatibility_against_latest_with_no_live_version_is_compatible(
    sr_client: SchemaRegistryClient,
) -> None:
    """Nothing to be incompatible with: ``latest`` answers true; a missing number 40402."""
    assert sr_client.test_compatibility("new-value", V1) is True  # version="latest"
    assert sr_client.test_compatibility("new-value", V1, version=-1) is True
    missing = error_of(lambda: sr_client.test_compatibility("new-value", V1, version=1))
    assert (missing.http_status_code, missing.error_code) == (404, 40402)
    sr_client.register_schema("gone-value", V1)
    assert sr_client.test_compatibility("gone-value", V2) is False
    assert sr_client.delete_subject("gone-value") == [1]
    assert sr_client.test_compatibility("gone-value", V2) is True  # the deleted one is no base
    deleted = error_of(lambda: sr_client.test_compatibility("gone-value", V2, version=1))
    assert deleted.error_code == 40402
    assert sr_client.test_compatibility_all_versions("gone-value", V2) is True


def test_import_mode_refuses_a_registration_without_an_id(
    sr_client: SchemaRegistryClient,
) -> None:
    """IMPORT takes ids, it does not make them: an id-less new version answers 42205."""
    assert sr_client.update_mode("imp-value", "IMPORT") == "IMPORT"
    refused = error_of(lambda: sr_client.register_schema("imp-value", V1))
    assert (refused.http_status_code, refused.error_code) == (422, 42205)
    assert "read-write" in refused.error_message
    url = sr_client.config()["url"]
    imported = httpx.post(
        f"{url}/subjects/imp-value/versions", json={"schema": V1.schema_str, "id": 900}
    )
    assert imported.json() == {"id": 900}
    # A schema the subject holds is still answered without an id (it is looked up first).
    sr_client.clear_caches()
    assert sr_client.register_schema("imp-value", V1) == 900
    assert error_of(lambda: sr_client.register_schema("imp-value", V2)).error_code == 42205
    assert sr_client.get_versions("imp-value") == [1]
    assert sr_client.update_global_mode("IMPORT", force=True) == "IMPORT"
    assert error_of(lambda: sr_client.register_schema("other-value", V1)).error_code == 42205
    assert error_of(lambda: sr_client.get_versions("other-value")).error_code == 40401


@pytest.mark.parametrize("subject", ["held-value", "nobody-value"])
def test_deleting_a_subject_setting_it_does_not_have_answers_40401(
    sr_client: SchemaRegistryClient, subject: str
) -> None:
    """DELETE /config/{s} and /mode/{s} answer the subject's own value, or 40401 without one."""
    if subject == "held-value":
        sr_client.register_schema(subject, V1)
    sr_client.set_compatibility(level="FULL")
    for delete in (sr_client.delete_config, sr_client.delete_mode):
        missing = error_of(lambda d=delete: d(subject))
        assert (missing.http_status_code, missing.error_code) == (404, 40401)
        assert subject in missing.error_message
    assert sr_client.set_compatibility(subject, "NONE") == {"compatibility": "NONE"}
    assert sr_client.delete_config(subject).compatibility_level.value == "NONE"
    assert error_of(lambda: sr_client.delete_config(subject)).error_code == 40401
    assert sr_client.update_mode(subject, "READONLY") == "READONLY"
    assert sr_client.delete_mode(subject) == "READONLY"
    assert error_of(lambda: sr_client.delete_mode(subject)).error_code == 40401
    # Reading is unchanged: no own value answers 40409 / 40408, or the global one if asked.
    assert error_of(lambda: sr_client.get_mode(subject)).error_code == 40409
    assert error_of(lambda: sr_client.get_compatibility(subject)).error_code == 40408
    url = sr_client.config()["url"]
    mode = httpx.get(f"{url}/mode/{subject}", params={"defaultToGlobal": "true"})
    assert mode.json() == {"mode": "READWRITE"}
    level = httpx.get(f"{url}/config/{subject}", params={"defaultToGlobal": "true"})
    assert level.json() == {"compatibilityLevel": "FULL"}


@pytest.mark.parametrize("raw", ["LATEST", "Latest", "%20latest%20", "%20-1%20", "%202%20"])
def test_a_version_is_read_as_confluent_reads_it(registry_url: str, raw: str) -> None:
    """``latest`` in any case and a number, each after trimming, as Confluent's VersionId."""
    httpx.put(f"{registry_url}/config/ver-value", json={"compatibility": "NONE"})
    for schema in (V1, OTHER):
        httpx.post(
            f"{registry_url}/subjects/ver-value/versions", json={"schema": schema.schema_str}
        )
    got = httpx.get(f"{registry_url}/subjects/ver-value/versions/{raw}")
    assert (got.status_code, got.json()["version"]) == (200, 2), got.text
    test = httpx.post(
        f"{registry_url}/compatibility/subjects/ver-value/versions/{raw}",
        json={"schema": V1.schema_str},
    )
    assert test.json() == {"is_compatible": True}, test.text
    assert httpx.delete(f"{registry_url}/subjects/ver-value/versions/{raw}").json() == 2


@pytest.mark.parametrize("raw", ["1_0", "lat%20est", "latest1", "-1-"])
def test_a_version_confluent_cannot_parse_answers_42202(registry_url: str, raw: str) -> None:
    """Python reads ``1_0`` as 10; Java's Integer.parseInt refuses it, and so does the registry."""
    httpx.put(f"{registry_url}/config/bad-value", json={"compatibility": "NONE"})
    for number in range(10):
        schema = avro(*[(f"f{i}", "long") for i in range(number + 1)])
        httpx.post(
            f"{registry_url}/subjects/bad-value/versions", json={"schema": schema.schema_str}
        )
    assert httpx.get(f"{registry_url}/subjects/bad-value/versions/10").status_code == 200
    got = httpx.get(f"{registry_url}/subjects/bad-value/versions/{raw}")
    assert (got.status_code, got.json()["error_code"]) == (422, 42202), got.text


def test_registering_a_soft_deleted_schema_again_removes_its_deleted_versions(
    sr_client: SchemaRegistryClient,
) -> None:
    """A new version with the id of soft-deleted earlier versions removes those for good.

    Confluent's register tombstones every soft-deleted version of the subject holding the id
    the new version gets; soft-deleted versions of other schemas stay.
    """
    id1 = sr_client.register_schema("again-value", V1)
    sr_client.set_compatibility("again-value", "NONE")
    id2 = sr_client.register_schema("again-value", OTHER)
    assert sr_client.delete_subject("again-value") == [1, 2]
    sr_client.clear_caches()
    assert sr_client.register_schema("again-value", V1) == id1
    assert sr_client.get_versions("again-value") == [3]
    assert sr_client.get_versions("again-value", deleted=True) == [2, 3]
    gone = error_of(lambda: sr_client.get_version("again-value", 1, deleted=True))
    assert gone.error_code == 40402
    assert sr_client.get_version("again-value", 2, deleted=True).schema_id == id2
    assert json.loads(sr_client.get_schema(id1).schema_str)["name"] == "test.User"
    # Soft-deleting the version alone, then registering the schema once more, is the same.
    assert sr_client.delete_version("again-value", 3) == 3
    sr_client.clear_caches()
    assert sr_client.register_schema("again-value", V1) == id1
    assert sr_client.get_versions("again-value", deleted=True) == [2, 4]


def test_no_schema_id_past_2_31_minus_1_is_generated(registry_url: str) -> None:
    """Confluent ids are Java ints: once 2^31-1 is taken a new schema is refused, not given 2^31."""
    httpx.put(f"{registry_url}/mode/top-value", json={"mode": "IMPORT"})
    top = httpx.post(
        f"{registry_url}/subjects/top-value/versions",
        json={"schema": V1.schema_str, "id": 2**31 - 1, "version": 1},
    )
    assert top.json() == {"id": 2**31 - 1}
    refused = httpx.post(
        f"{registry_url}/subjects/next-value/versions", json={"schema": OTHER.schema_str}
    )
    assert (refused.status_code, refused.json()["error_code"]) == (500, 50001), refused.text
    assert "2^31-1" in refused.json()["message"], refused.text
    assert "IMPORT" in refused.json()["message"], refused.text
    # Nothing was stored: the subject has no version, and a schema the registry holds still
    # registers under its id.
    assert httpx.get(f"{registry_url}/subjects/next-value/versions").status_code == 404
    again = httpx.post(
        f"{registry_url}/subjects/next-value/versions", json={"schema": V1.schema_str}
    )
    assert again.json() == {"id": 2**31 - 1}, again.text


def test_no_version_past_2_31_minus_1_is_appended(registry_url: str) -> None:
    """A subject whose last version is 2^31-1 refuses another one with a line, not a 500 or 2^31."""
    httpx.put(f"{registry_url}/mode/last-value", json={"mode": "IMPORT"})
    top = httpx.post(
        f"{registry_url}/subjects/last-value/versions",
        json={"schema": V1.schema_str, "id": 5, "version": 2**31 - 1},
    )
    assert top.json() == {"id": 5}
    httpx.put(f"{registry_url}/mode/last-value", json={"mode": "READWRITE"})
    httpx.put(f"{registry_url}/config/last-value", json={"compatibility": "NONE"})
    refused = httpx.post(
        f"{registry_url}/subjects/last-value/versions", json={"schema": OTHER.schema_str}
    )
    assert (refused.status_code, refused.json()["error_code"]) == (500, 50001), refused.text
    assert "2^31-1" in refused.json()["message"], refused.text
    assert "last-value" in refused.json()["message"], refused.text
    assert httpx.get(f"{registry_url}/subjects/last-value/versions").json() == [2**31 - 1]


def test_an_import_of_an_id_holding_another_schema_is_refused_in_confluents_words(
    registry_url: str,
) -> None:
    """42205 "Overwrite new schema with id N is not permitted.", as Confluent answers it."""
    httpx.put(f"{registry_url}/mode/first-value", json={"mode": "IMPORT"})
    httpx.put(f"{registry_url}/mode/second-value", json={"mode": "IMPORT"})
    first = httpx.post(
        f"{registry_url}/subjects/first-value/versions", json={"schema": V1.schema_str, "id": 7}
    )
    assert first.json() == {"id": 7}, first.text
    taken = httpx.post(
        f"{registry_url}/subjects/second-value/versions", json={"schema": OTHER.schema_str, "id": 7}
    )
    assert taken.status_code == 422, taken.text
    assert taken.json() == {
        "error_code": 42205,
        "message": "Overwrite new schema with id 7 is not permitted.",
    }


def test_a_refused_import_leaves_the_generated_ids_alone(registry_url: str) -> None:
    """An IMPORT refused for its taken version stores nothing, so new schemas still get ids."""
    httpx.put(f"{registry_url}/mode/moved-value", json={"mode": "IMPORT"})
    first = httpx.post(
        f"{registry_url}/subjects/moved-value/versions",
        json={"schema": V1.schema_str, "id": 5, "version": 1},
    )
    assert first.json() == {"id": 5}, first.text
    taken = httpx.post(
        f"{registry_url}/subjects/moved-value/versions",
        json={"schema": OTHER.schema_str, "id": 2**31 - 1, "version": 1},
    )
    assert (taken.status_code, taken.json()["error_code"]) == (422, 42207), taken.text
    assert httpx.get(f"{registry_url}/schemas/ids/{2**31 - 1}").status_code == 404
    fresh = httpx.post(
        f"{registry_url}/subjects/new-value/versions", json={"schema": V2.schema_str}
    )
    assert fresh.status_code == 200, fresh.text
    assert fresh.json()["id"] < 2**31 - 1
