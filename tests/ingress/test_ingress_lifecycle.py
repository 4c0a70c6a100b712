"""``pipeline ingress serve`` stopped by a signal: it drains what it accepted, then exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from contract.helpers import consume_until, make_topic
from ingress.helpers import (
    meta_body,
    serve_until_listening,
    write_whatsapp_source,
)
from ingress.redis_server import RedisServer
from ingress.signing import hub_signature

from pipeline.config import Settings
from pipeline.ingress import headers as h
from pipeline.logstore import RowState, Selection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.transport import create_transport

SECRET = "lifecycle-secret"  # noqa: S105 - a test secret


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, which the test may pause (SIGSTOP) and resume."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    if server.process is not None:
        server.process.send_signal(signal.SIGCONT)
    server.stop()


@pytest.fixture
async def env(
    tmp_path: Path, settings: Settings, private_redis: RedisServer, unique: str
) -> AsyncIterator[dict[str, str]]:
    """The environment of an ingress on SQLite and the private Redis, with a topic of its own."""
    topic = f"messages-{unique}"
    broker = settings.model_copy(
        update={"redis": settings.redis.model_copy(update={"url": private_redis.url})}
    )
    transport = create_transport(broker, "redis")
    await make_topic(transport, topic, 2)
    write_whatsapp_source(tmp_path, topic, "env:PIPELINE_TEST_LIFE_SECRET")
    variables = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    yield variables | {
        "PIPELINE_TEST_LIFE_SECRET": SECRET,
        "PIPELINE_TEST_LIFE_TOPIC": topic,
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": private_redis.url,
        "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
        "PIPELINE_INGRESS__SOURCES_FILE": str(tmp_path / "sources.yaml"),
        "PIPELINE_INGRESS__SQLITE_PATH": str(tmp_path / "ingress.db"),
        "PIPELINE_INGRESS__SWEEPER__ENABLED": "false",
    }
    await transport.close()


async def post(url: str, numbers: range) -> list[int]:
    """POST the numbered Meta deliveries, signed; their status codes."""
    statuses = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for n in numbers:
            body = meta_body(n)
            headers = {"x-hub-signature-256": hub_signature(SECRET, body)}
            statuses.append(
                (await http.post("/hooks/whatsapp", content=body, headers=headers)).status_code
            )
    return statuses


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
async def test_a_stop_signal_produces_the_queued_events_and_exits_0(
    tmp_path: Path,
    settings: Settings,
    env: dict[str, str],
    private_redis: RedisServer,
    started: list[subprocess.Popen[str]],
    stop: signal.Signals,
) -> None:
    """Events accepted but not yet produced when the signal comes are produced before the exit."""
    proc, url = serve_until_listening(env, started)
    assert private_redis.process is not None
    private_redis.process.send_signal(signal.SIGSTOP)  # the broker stalls: produces wait
    try:
        assert await post(url, range(5)) == [200] * 5
        proc.send_signal(stop)
    finally:
        private_redis.process.send_signal(signal.SIGCONT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr

    store = SqliteLogStore(tmp_path / "ingress.db")
    await store.open()
    try:
        assert await store.count_by_state(Selection()) == {RowState.PRODUCED: 5}
    finally:
        await store.close()
    broker = settings.model_copy(
        update={"redis": settings.redis.model_copy(update={"url": private_redis.url})}
    )
    transport = create_transport(broker, "redis")
    consumer = transport.consumer("lifecycle", [env["PIPELINE_TEST_LIFE_TOPIC"]])
    got = await consume_until(consumer, lambda r: len(r) >= 5)
    await consumer.close()
    await transport.close()
    assert sorted(m.headers[h.EVENT_ID].decode() for m in got) == [f"wamid.{n}" for n in range(5)]
