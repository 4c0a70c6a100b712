"""The services `make services` starts answer as the rest of the project expects."""

from __future__ import annotations

import psycopg
import redis


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
