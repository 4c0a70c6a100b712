"""``pipeline ingress serve`` asks a broker that does not answer once at its start, not twice.

The start's probe (:func:`~pipeline.ingress.cli.refuse_a_refused_login`) worked out whether
the broker had refused the login twice: once where the probe's line was made, once more from
that line with its prefixes stripped, each a plain TCP connection of up to 1 s to a
``rediss://`` port whose handshake timed out. And with the broker down, the topics' size limits
were asked of it again, waiting out a second bound (10 s) before the ingress served. The probe
now carries what it found, and a broker it found down has its limits skipped, with one line.
"""

from __future__ import annotations

import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from ingress.helpers import listened_then_stopped
from support import BROKER_DOWN, cli_environment

from pipeline.config import load_settings
from pipeline.ingress.cli import refuse_a_refused_login

START_S = 60.0
"""The longest a start may take to listen; a bound, not a wait."""
PLAIN_PING = b"PING\r\n"
"""What the plain-text probe of a ``rediss://`` port sends first (a TLS client sends 0x16)."""
ASKED = "check_topic_limits asked the broker"
SPIED_SERVE = """
import sys

import pipeline.ingress.service as service
from pipeline.cli import main

checked = service.check_topic_limits


async def counted(*args, **kwargs):
    print(ASKED, file=sys.stderr, flush=True)
    return await checked(*args, **kwargs)


service.check_topic_limits = counted
sys.argv = ["pipeline", "ingress", "serve", "--port", "0", *sys.argv[1:]]
main()
""".replace("ASKED", repr(ASKED))
"""``pipeline ingress serve ARGS`` with a stderr line each time the topics' limits are asked
(in this process: the ``--workers`` supervisor's, where they are asked once for all)."""


@pytest.fixture
def silent_port() -> Iterator[socket.socket]:
    """A listening socket that takes connections (the kernel's backlog) and never answers."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server


def first_bytes(server: socket.socket) -> list[bytes]:
    """What each connection waiting in ``server``'s backlog sent first (all closed by now)."""
    server.settimeout(0.0)  # no wait: what is not in the backlog now never came
    sent = []
    while True:
        try:
            conn, _ = server.accept()
        except BlockingIOError:
            return sent
        with conn:
            conn.settimeout(5.0)  # the client has closed it: its bytes and EOF are there
            sent.append(conn.recv(len(PLAIN_PING)))


async def test_a_tls_timeout_is_asked_of_the_plain_port_once(silent_port: socket.socket) -> None:
    """A ``rediss://`` handshake that timed out: one plain-text probe of the port, not two."""
    port = silent_port.getsockname()[1]
    redis = {"url": f"rediss://127.0.0.1:{port}/0", "socket_timeout_s": 1.0}
    settings = load_settings(transport="redis", redis=redis)
    await refuse_a_refused_login(settings)  # a port that answers nothing: down, no refusal
    probes = [sent for sent in first_bytes(silent_port) if sent == PLAIN_PING]
    assert len(probes) == 1, probes


def serve_spied(env: dict[str, str], cwd: Path, *options: str) -> tuple[bool, str]:
    """Start the spied ingress with ``options``; whether it listened, its stderr once stopped."""
    listened, ended = listened_then_stopped(
        [sys.executable, "-c", SPIED_SERVE, *options], env, cwd, START_S
    )
    return listened, ended.stderr


def down_environment(tmp_path: Path, transport: str, **extra: str) -> dict[str, str]:
    """An ingress of one source (to ``messages``) on ``transport``, its broker down (``extra``)."""
    env = cli_environment(
        tmp_path, PIPELINE_TRANSPORT=transport, PIPELINE_INGRESS__SWEEPER__ENABLED="false", **extra
    )
    (tmp_path / "sources.yaml").write_text(
        "sources:\n  plain:\n    scheme: none\n    topic: messages\n", encoding="utf-8"
    )
    return env


def assert_asked_once(err: str, named: list[str]) -> None:
    """The limits were not asked after the probe; one line said they were skipped, and why."""
    assert ASKED not in err
    skipped = [line for line in err.splitlines() if "topic size limits not checked" in line]
    assert len(skipped) == 1, err
    assert all(word in skipped[0] for word in named), skipped[0]


@pytest.mark.parametrize(("transport", "extra", "named"), BROKER_DOWN, ids=lambda v: str(v)[:5])
def test_a_broker_down_at_the_start_is_asked_once(
    tmp_path: Path, transport: str, extra: dict[str, str], named: list[str]
) -> None:
    """The probe found the broker down: the limits are not asked again, one line says so."""
    listened, err = serve_spied(down_environment(tmp_path, transport, **extra), tmp_path)
    assert listened, err  # a broker that is down does not stop the ingress
    assert_asked_once(err, named)


@pytest.mark.postgres
async def test_a_broker_down_at_the_workers_start_is_asked_once(
    tmp_path: Path, postgres_service: str
) -> None:
    """``--workers 2``: the supervisor's preflight does not ask the limits of it either."""
    transport, extra, named = BROKER_DOWN[0]  # Kafka: the limits would wait out 10 s more
    schema = f"asked_{uuid.uuid4().hex[:12]}"
    env = down_environment(
        tmp_path,
        transport,
        PIPELINE_INGRESS__LOG_STORE="postgres",
        PIPELINE_POSTGRES__URL=postgres_service,
        PIPELINE_INGRESS__POSTGRES_SCHEMA=schema,
        **extra,
    )
    try:
        listened, err = serve_spied(env, tmp_path, "--workers", "2")
    finally:
        async with await psycopg.AsyncConnection.connect(postgres_service, autocommit=True) as c:
            await c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    assert listened, err
    assert_asked_once(err, named)
