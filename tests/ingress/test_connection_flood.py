"""Connections by the hundred that send nothing, half a head or half a body, past the fd limit.

``pipeline ingress serve`` runs with its open-file limit lowered to 256. Without a bound on
connections, the stalled ones took every descriptor: libuv then accepted each new connection
and closed it at once (its EMFILE fallback), so a signed webhook on a fresh connection was cut
off without an answer, and without a log line, for as long as the flood held. With the bound
(``PIPELINE_INGRESS__MAX_CONNECTIONS``, by default the open-file limit less a reserve for the
log store and the broker), a connection past it closes the oldest stalled one: legitimate
webhooks are accepted, one log line says so, and a counter counts it.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import sqlite3
import subprocess
from pathlib import Path

import httpx
import pytest
from contract.helpers import make_topic
from ingress.helpers import META, PIPELINE, meta_body, write_sources, write_topics
from ingress.signing import hub_signature

from pipeline.config import IngressSettings, Settings
from pipeline.errors import ConfigError
from pipeline.ingress.service import FD_RESERVE, max_connections
from pipeline.transport import create_transport

SECRET = "flood-secret"  # noqa: S105 - a test secret
OPEN_FILES = 256
PER_KIND = 110  # three kinds: 330 stalled connections, past the open-file limit
STALLED = (
    b"",
    b"POST /hooks/whatsapp HTTP/1.1\r\nHost: ingress\r\n",
    b"POST /hooks/whatsapp HTTP/1.1\r\nHost: ingress\r\nContent-Length: 1000\r\n\r\n{",
)
Held = list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]


def _few_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def _start(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[str], str]:
    with log.open("w", encoding="utf-8") as stderr:
        proc = subprocess.Popen(
            [PIPELINE, "ingress", "serve", "--port", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            preexec_fn=_few_open_files,  # noqa: PLW1509 - only setrlimit, before exec
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ingress listening on "), log.read_text(encoding="utf-8")
    return proc, line.removeprefix("ingress listening on ").strip()


async def _post(url: str, n: int) -> int:
    body = meta_body(n)
    headers = {"x-hub-signature-256": hub_signature(SECRET, body)}
    async with httpx.AsyncClient(base_url=url, timeout=20) as http:
        try:
            response = await http.post("/hooks/whatsapp", content=body, headers=headers)
        except httpx.TransportError:
            return 0  # cut off without an answer
        return response.status_code


async def _flood(port: int) -> Held:
    held: Held = []
    for start in STALLED:
        for _ in range(PER_KIND):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(start)
            held.append((reader, writer))
    return held


async def _metric(url: str) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=20) as http:
        return (await http.get("/metrics")).text


async def _counted(url: str) -> str:
    """``/metrics`` once it counts connections past the bound (refreshed each 0.2 s), or in 10 s."""
    text = ""
    for _ in range(500):
        text = await _metric(url)
        if 'outcome="connection_limit"' in text:
            break
        await asyncio.sleep(0.02)  # polling the next refresh
    return text


async def test_stalled_connections_past_the_fd_limit_leave_room_for_webhooks(
    tmp_path: Path, settings: Settings, redis_service: str, unique: str
) -> None:
    """Webhooks are accepted through the flood and after it; every 200 is a row; few log lines."""
    topic = f"messages-{unique}"
    transport = create_transport(settings, "redis")
    await make_topic(transport, topic, 2)
    write_topics(tmp_path / "topics", {topic: "messages"})
    write_sources(
        tmp_path / "sources.yaml",
        {"whatsapp": {**META, "secrets": [SECRET], "topic": topic, "routes": []}},
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env |= {
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": redis_service,
        "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
        "PIPELINE_INGRESS__SOURCES_FILE": str(tmp_path / "sources.yaml"),
        "PIPELINE_INGRESS__SQLITE_PATH": str(tmp_path / "ingress.db"),
        "PIPELINE_INGRESS__SWEEPER__ENABLED": "false",
        "PIPELINE_INGRESS__METRICS_INTERVAL_S": "0.2",
    }
    log = tmp_path / "stderr.log"
    proc, url = _start(env, log)
    held: Held = []
    try:
        held = await _flood(int(url.rsplit(":", 1)[1]))
        during = [await _post(url, n) for n in range(3)]
        assert proc.poll() is None
        for _, writer in held:
            writer.close()
        after = await _post(url, 3)
        text = await _counted(url)
    finally:
        for _, writer in held:
            writer.close()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        await transport.close()
    assert during == [200, 200, 200]
    assert after == 200
    assert 'outcome="connection_limit"' in text
    with sqlite3.connect(tmp_path / "ingress.db") as db:
        (rows,) = db.execute("SELECT count(*) FROM ingress_log").fetchone()
    assert rows == 4  # every webhook answered 200 is in the log, and only those
    lines = [line for line in log.read_text(encoding="utf-8").splitlines() if "MAX_CONN" in line]
    assert 1 <= len(lines) <= 3, lines  # not one line per connection


def test_the_bound_defaults_to_the_open_file_limit_less_the_reserve() -> None:
    """Unset, the bound leaves :data:`FD_RESERVE` descriptors; a bound above that refuses."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        pytest.skip("no open-file limit to derive the bound from")
    assert max_connections(IngressSettings()) == soft - FD_RESERVE
    assert max_connections(IngressSettings(max_connections=10)) == 10
    with pytest.raises(ConfigError, match="PIPELINE_INGRESS__MAX_CONNECTIONS"):
        max_connections(IngressSettings(max_connections=soft - FD_RESERVE + 1))
