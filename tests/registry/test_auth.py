"""Optional basic and bearer authentication with read-only and read-write roles."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from pipeline.config import AuthSettings, BasicUser, BearerToken
from pipeline.registry.client.http import RegistryClient
from pipeline.registry.errors import Forbidden, Unauthorized
from pipeline.registry.server.api import create_app
from pipeline.registry.server.serve import BackgroundServer
from pipeline.registry.stores.sqlite.store import SqliteSchemaStore

WRITER_PASSWORD = "w-s3cret-pw"  # noqa: S105 - test credential
READER_PASSWORD = "r-s3cret-pw"  # noqa: S105 - test credential
TOKEN = "tok-s3cret-value"  # noqa: S105 - test credential
SCHEMA = Schema(json.dumps({"type": "record", "name": "A", "fields": []}), "AVRO")


@pytest.fixture
def protected_url(tmp_path: Path) -> Iterator[str]:
    """A registry that requires credentials: a writer, a reader and a read-only token."""
    auth = AuthSettings(
        users=(
            BasicUser(username="writer", password=WRITER_PASSWORD, role="write"),
            BasicUser(username="reader", password=READER_PASSWORD, role="read"),
        ),
        tokens=(BearerToken(name="dashboards", token=TOKEN, role="read"),),
    )
    store = SqliteSchemaStore(str(tmp_path / "r.db"))
    with BackgroundServer(create_app(store, auth=auth)) as server:
        yield server.url
    store.close()


def client(url: str, user: str, password: str) -> SchemaRegistryClient:
    """A real client presenting basic credentials."""
    return SchemaRegistryClient(
        {"url": url, "basic.auth.user.info": f"{user}:{password}", "max.retries": 0}
    )


def test_roles_with_the_real_client(protected_url: str) -> None:
    """The writer registers, the reader reads but may not write, a wrong password is refused."""
    writer = client(protected_url, "writer", WRITER_PASSWORD)
    reader = client(protected_url, "reader", READER_PASSWORD)
    stranger = client(protected_url, "reader", "wrong")
    try:
        schema_id = writer.register_schema("a-value", SCHEMA)
        assert reader.get_latest_version("a-value").schema_id == schema_id
        assert reader.lookup_schema("a-value", SCHEMA).version == 1  # a POST that only reads
        with pytest.raises(SchemaRegistryError) as denied:
            reader.register_schema("b-value", SCHEMA)
        assert (denied.value.http_status_code, denied.value.error_code) == (403, 40301)
        with pytest.raises(SchemaRegistryError) as refused:
            stranger.get_subjects()
        assert refused.value.http_status_code == 401
    finally:
        for c in (writer, reader, stranger):
            c.close()


def test_bearer_tokens_and_challenge(protected_url: str) -> None:
    """A read token reads; no credential gets 401 with a WWW-Authenticate challenge."""
    anonymous = httpx.get(f"{protected_url}/subjects")
    assert anonymous.status_code == 401
    assert "Basic" in anonymous.headers["www-authenticate"]
    reading = RegistryClient(protected_url, token=TOKEN)
    try:
        assert reading.subjects() == []
        with pytest.raises(Forbidden):
            reading.register("a-value", SCHEMA.schema_str)  # type: ignore[arg-type]
    finally:
        reading.close()
    wrong = RegistryClient(protected_url, token="nope")  # noqa: S106 - a wrong token on purpose
    with pytest.raises(Unauthorized):
        wrong.subjects()
    wrong.close()


def test_secrets_are_never_logged(protected_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Refusals are logged by user name or token name, never with a password or a token."""
    caplog.set_level(logging.DEBUG, logger="pipeline")
    caplog.set_level(logging.DEBUG, logger="uvicorn")
    httpx.get(f"{protected_url}/subjects", auth=("reader", "wrong-" + READER_PASSWORD))
    httpx.get(f"{protected_url}/subjects", headers={"Authorization": f"Bearer x{TOKEN}"})
    httpx.post(
        f"{protected_url}/subjects/a/versions",
        json={"schema": SCHEMA.schema_str},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    server_side = ("pipeline", "uvicorn", "starlette")  # httpx's own debug log is the client's
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith(server_side))
    assert "reader" in logged
    for secret in (WRITER_PASSWORD, READER_PASSWORD, TOKEN):
        assert secret not in logged
    assert TOKEN not in repr(AuthSettings(tokens=(BearerToken(name="t", token=TOKEN),)))
