"""Hostile requests against a running registry (uvicorn, real SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from pipeline.registry.server.api import create_app
from pipeline.registry.server.serve import BackgroundServer
from pipeline.registry.server.service import Registry
from pipeline.registry.stores.protocol import RegistryStore
from pipeline.registry.stores.sqlite.store import SqliteSchemaStore

CONTENT = {"content-type": "application/vnd.schemaregistry.v1+json"}


def doubling_schema(depth: int, leaf: str = "int") -> dict[str, Any]:
    """Records ``L0..L<depth>``, each with two fields of the level below (the 2nd by name)."""
    schema: Any = {"type": "record", "name": "L0", "fields": [{"name": "v", "type": leaf}]}
    for level in range(1, depth + 1):
        schema = {
            "type": "record",
            "name": f"L{level}",
            "fields": [
                {"name": "a", "type": schema},
                {"name": "b", "type": f"L{level - 1}"},
            ],
        }
    return schema


@pytest.fixture
def served(store: RegistryStore) -> Iterator[tuple[str, Registry]]:
    """A registry served by uvicorn over each real store, with its :class:`Registry`."""
    app = create_app(store)
    with BackgroundServer(app) as server:
        yield server.url, app.state.registry


@pytest.mark.timeout(60)
def test_a_doubling_schema_is_checked_once_per_type_pair(served: tuple[str, Registry]) -> None:
    """Depth 30 (two references per level) registers and is refused in linear work, not 2^30."""
    url, _ = served
    subject = f"{url}/subjects/deep-value/versions"
    with httpx.Client(timeout=30) as http:
        first = http.post(subject, json={"schema": json.dumps(doubling_schema(30))})
        wider = doubling_schema(30, leaf="long")  # int -> long: backward compatible
        second = http.post(subject, json={"schema": json.dumps(wider)})
        narrower = doubling_schema(30, leaf="string")  # long -> string: incompatible
        refused = http.post(subject, json={"schema": json.dumps(narrower)})
    assert (first.status_code, second.status_code, refused.status_code) == (200, 200, 409)
    assert refused.json()["message"].count("TYPE_MISMATCH") == 1


def _raw_post(url: str, head: bytes, body: bytes) -> bytes:
    """Send ``head`` and ``body`` as they are; the whole answer: its head and its body.

    The server writes an answer's head and body separately, so one read may end between them.
    """
    parsed = urlparse(url)

    async def send() -> bytes:
        reader, writer = await asyncio.open_connection(parsed.hostname, parsed.port)
        writer.write(head + body)
        await writer.drain()
        async with asyncio.timeout(20):
            answer = await reader.readuntil(b"\r\n\r\n")
            fields = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.partition(b":") for line in answer.split(b"\r\n")[1:])
            }
            length = int(fields.get(b"content-length", b"0"))
            answer += await reader.readexactly(length)
        writer.close()
        return answer

    return asyncio.run(send())


@pytest.mark.parametrize("declared", [True, False])
def test_a_huge_body_is_refused_without_reading_it_whole(
    served: tuple[str, Registry], declared: bool
) -> None:
    """A body over the cap is answered 422 while the client is still sending it."""
    url, _ = served
    length = b"Content-Length: 314572800\r\n" if declared else b"Transfer-Encoding: chunked\r\n"
    head = b"POST /subjects/big/versions HTTP/1.1\r\nHost: r\r\n" + length + b"\r\n"
    sent = b"x" * 2_097_152  # 2 MiB of the 300 MiB promised, then the client waits
    body = sent if declared else b"%x\r\n" % len(sent) + sent + b"\r\n"
    answer = _raw_post(url, head, body)
    assert answer.startswith(b"HTTP/1.1 422"), answer[:200]
    assert b"request body over" in answer


def test_readers_do_not_fill_the_parse_cache(served: tuple[str, Registry]) -> None:
    """Lookups of 30 distinct large schemas leave nothing of them in the registry's caches."""
    url, registry = served
    before = registry.cache_bytes
    with httpx.Client(timeout=30) as http:
        for n in range(30):
            fields = [{"name": f"f{n}_{i}", "type": "string"} for i in range(2_000)]
            schema = {"type": "record", "name": f"R{n}", "fields": fields}
            answer = http.post(f"{url}/subjects/nobody", json={"schema": json.dumps(schema)})
            assert answer.status_code == 404
    assert registry.cache_bytes == before


def test_a_store_error_is_not_echoed_to_the_client(tmp_path: Path) -> None:
    """A failing database answers 500 with a fixed message; its own text stays in the log."""
    path = tmp_path / "registry.db"
    store = SqliteSchemaStore(str(path))
    with BackgroundServer(create_app(store)) as server:
        with sqlite3.connect(path) as db:
            db.execute("DROP TABLE registry_versions")
        answer = httpx.get(f"{server.url}/subjects", timeout=10)
    store.close()
    assert answer.status_code == 500
    assert answer.json() == {"error_code": 50001, "message": "Error in the backend data store"}
