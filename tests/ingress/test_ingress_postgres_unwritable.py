"""``pipeline ingress serve`` whose PostgreSQL log stops taking writes, then takes them again.

The faults are real ones. Read-only: a database of the test's own is set
``default_transaction_read_only`` (as a server read-only after a failover refuses writes) and its
sessions are ended, so the ones the ingress opens next cannot write; the setting is then reset,
and nothing else is done (the sessions opened meanwhile stay read-only). Unreachable: the ingress
reaches the server through a relay that is cut (a network partition of this replica), then
listens again.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from ingress.helpers import PIPELINE, Webhooks, serving, terminated, whatsapp_ingress_env
from logstore.relay import Relay, relay_to
from psycopg import sql

from pipeline.config import Settings
from pipeline.transport import create_transport
from pipeline.transport.protocol import TopicConfig

SECRET = "pg-unwritable-secret"  # noqa: S105 - a test secret
STATES = ("received", "produced", "processed", "abandoned")


@pytest.fixture
async def database(postgres_service: str, unique: str) -> AsyncIterator[str]:
    """The URL of a database made for the test, dropped after it (its sessions ended)."""
    name = f"pgready_{unique}"
    async with await psycopg.AsyncConnection.connect(postgres_service, autocommit=True) as admin:
        await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield urlsplit(postgres_service)._replace(path=f"/{name}").geturl()
        finally:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            await admin.execute(drop.format(sql.Identifier(name)))


async def read_only(admin: str, url: str, *, on: bool) -> None:
    """Set or reset ``default_transaction_read_only`` of ``url``'s database, from ``admin``'s.

    Set: the database's sessions are ended too (the setting applies to new sessions only).
    """
    name = sql.Identifier(urlsplit(url).path.lstrip("/"))
    alter = sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on")
    if not on:
        alter = sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only")
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(alter.format(name))
        if on:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                [urlsplit(url).path.lstrip("/")],
            )


@pytest.fixture
async def relay(postgres_service: str) -> AsyncIterator[Relay]:
    """A started relay to the test PostgreSQL, cut afterwards."""
    async with relay_to(postgres_service) as started:
        yield started


@pytest.fixture
async def topic(settings: Settings, redis_service: str, unique: str) -> AsyncIterator[str]:
    """A Redis Streams topic of the test's own and its dead-letter topic, deleted after it."""
    name = f"messages-{unique}"
    transport = create_transport(settings, "redis")
    admin = transport.admin()
    await admin.create_topic(TopicConfig(name, 2))
    await admin.create_topic(TopicConfig(f"{name}.dlq", 2))
    try:
        yield name
    finally:
        await admin.delete_topic(name)
        await admin.delete_topic(f"{name}.dlq")
        await transport.close()


def variables(tmp_path: Path, redis_url: str, topic: str, log_url: str) -> dict[str, str]:
    """The ingress's environment: sources and topic files here, the log at ``log_url``."""
    log = {
        "PIPELINE_INGRESS__LOG_STORE": "postgres",
        "PIPELINE_POSTGRES__URL": log_url,
        "PIPELINE_POSTGRES__CONNECT_TIMEOUT_S": "1",
    }
    return whatsapp_ingress_env(tmp_path, redis_url, topic, SECRET, **log)


async def stored(url: str) -> dict[str, int]:
    """Rows of the log per source, read directly."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT source, count(*) FROM ingress_log GROUP BY source")
        return dict(await cur.fetchall())


async def run(env: dict[str, str], *args: str) -> str:
    """Run ``pipeline *args``; what it printed (it must succeed)."""
    done = await asyncio.to_thread(
        subprocess.run,
        [str(PIPELINE), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


async def assert_no_probe_row(env: dict[str, str], database: str, hooks: Webhooks) -> None:
    """Only the accepted webhooks' rows are kept: status, replay and purge never meet a probe's."""
    accepted = len(hooks.accepted)
    assert await stored(database) == {"whatsapp": accepted}
    shown = await run(env, "status")
    line = next(line for line in shown.splitlines() if line.startswith("ingress log:"))
    counts = re.findall(r"(?:produced|received|processed) (\d+)", line.split(";")[0])
    assert sum(int(count) for count in counts) == accepted, shown
    shown = await run(env, "replay", "--dry-run", "--since", "1970-01-01T00:00:00Z")
    assert re.search(rf"total\W+{accepted}\b", shown), shown
    states = [arg for state in STATES for arg in ("--state", state)]
    shown = await run(env, "purge", "--older-than", "2999-01-01T00:00:00Z", *states)
    assert f"purged {accepted} rows" in shown, shown


async def test_a_read_only_log_answers_503_turns_unready_and_recovers(
    tmp_path: Path,
    redis_service: str,
    topic: str,
    database: str,
    postgres_service: str,
    started: list[subprocess.Popen[str]],
) -> None:
    """Read-only: webhooks and /readyz 503; writable again: /readyz and webhooks 200."""
    env = variables(tmp_path, redis_service, topic, database)
    async with serving(env, started, SECRET) as (proc, hooks):
        await hooks.send_accepted(3)
        await read_only(postgres_service, database, on=True)
        answers = [await hooks.send() for _ in range(5)]
        assert {a.status_code for a in answers} == {503}, [a.text for a in answers]
        assert all(a.headers.get("retry-after") for a in answers)
        assert await hooks.ready() == 503  # a load balancer stops sending
        await read_only(postgres_service, database, on=False)
        await hooks.until_ready()  # by itself: nothing is sent to it meanwhile
        assert (await hooks.send()).status_code == 200
        assert await hooks.ready() == 200
    stderr = await terminated(proc)
    assert "read-only transaction" in stderr, stderr
    await assert_no_probe_row(env, database, hooks)


async def test_an_unreachable_log_answers_503_turns_unready_and_recovers(
    tmp_path: Path,
    redis_service: str,
    topic: str,
    database: str,
    relay: Relay,
    started: list[subprocess.Popen[str]],
) -> None:
    """Cut off: webhooks and /readyz 503; reachable again: /readyz and webhooks 200."""
    parts = urlsplit(database)
    through = parts._replace(netloc=f"{parts.username}:{parts.password}@127.0.0.1:{relay.port}")
    env = variables(tmp_path, redis_service, topic, through.geturl())
    async with serving(env, started, SECRET) as (proc, hooks):  # the relay runs meanwhile
        await hooks.send_accepted(3)
        await relay.cut()
        answers = [await hooks.send() for _ in range(2)]
        assert {a.status_code for a in answers} == {503}, [a.text for a in answers]
        assert await hooks.ready() == 503
        await relay.start()
        await hooks.until_ready()
        assert (await hooks.send()).status_code == 200
        assert await hooks.ready() == 200
    await terminated(proc)
    await assert_no_probe_row(env | {"PIPELINE_POSTGRES__URL": database}, database, hooks)
