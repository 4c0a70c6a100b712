"""The services `make services` starts answer as the rest of the project expects."""

from __future__ import annotations

import os
import uuid
from urllib.parse import urlparse

import psycopg
import redis
from support import require_service

from pipeline.offload.store import open_store

# What deploy/local/s3proxy.sh configures (the environment wins when it names another service).
S3PROXY = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_ACCESS_KEY_ID": "pipeline",
    "AWS_SECRET_ACCESS_KEY": "pipeline-local-secret",
}


def test_postgres_has_the_pipeline_database(postgres_service: str) -> None:
    """PostgreSQL accepts the pipeline role on database `pipeline` and can create a table."""
    with psycopg.connect(postgres_service, connect_timeout=5) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("pipeline",)
        conn.execute("CREATE TEMP TABLE probe (id int)")
        conn.execute("INSERT INTO probe VALUES (1)")
        assert conn.execute("SELECT count(*) FROM probe").fetchone() == (1,)


def test_redis_is_version_seven_with_functions(redis_service: str) -> None:
    """Redis is 7 or newer, which the transport's Functions library needs."""
    client = redis.Redis.from_url(redis_service)
    try:
        major = int(str(client.info("server")["redis_version"]).split(".")[0])
        assert major >= 7
        assert isinstance(client.function_list(), list)
    finally:
        client.close()


async def test_s3proxy_serves_the_pipeline_bucket(monkeypatch) -> None:
    """S3Proxy answers S3 requests with the local credentials, and the bucket `pipeline` exists."""
    for name, value in S3PROXY.items():
        if not os.environ.get(name):
            monkeypatch.setenv(name, value)
    endpoint = urlparse(os.environ["AWS_ENDPOINT_URL"])
    require_service("s3proxy", endpoint.hostname or "127.0.0.1", endpoint.port or 9000)
    store = open_store(f"s3://pipeline/probe-{uuid.uuid4().hex[:8]}")
    await store.put("sha256/00/probe", b"probe")
    try:
        found = await store.head("sha256/00/probe")
        assert found is not None
        assert found.size == 5
    finally:
        await store.delete("sha256/00/probe")
