"""Helpers shared by the ingress tests: topic and source files, an app over a store, a sweep."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import IO, Any

import httpx
import psutil
import yaml
from ingress.signing import hub_signature
from logstore.helpers import FakeClock, new_row
from runtime.helpers import eventually
from support import delete_after_test, test_settings

from pipeline.config import (
    IngressSettings,
    IngressSlotSettings,
    RuntimeSettings,
    Settings,
    SweeperSettings,
)
from pipeline.ingress.app import IngressApp
from pipeline.ingress.dispatch import Dispatcher
from pipeline.ingress.service import Ingress, build_ingress, build_sweeper
from pipeline.ingress.settings import load_sources
from pipeline.ingress.source import Source, build_sources
from pipeline.ingress.sweeper import SweepReport
from pipeline.logstore import IngressLog, LogRow
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.runtime.member import Member
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec, load_specs
from pipeline.transport import create_transport
from pipeline.transport.protocol import TopicConfig, Transport

MAX_MESSAGE_BYTES = 1_048_576 + 65_536
PIPELINE = Path(sys.executable).with_name("pipeline")
ROOT = Path(__file__).parents[2]


LISTENING = "ingress listening on "
"""How the first line ``pipeline ingress serve`` writes on its stdout begins: then its URL."""


def ingress_env(
    tmp_path: Path, redis_url: str, topics_dir: Path | None = None, **extra: str
) -> dict[str, str]:
    """The environment of an ingress on Redis at ``redis_url``, sweeper off, files in ``tmp_path``.

    Its sources file is ``tmp_path/sources.yaml``, its log ``tmp_path/ingress.db``, its topics
    ``topics_dir`` (by default ``tmp_path/topics``); none of the caller's ``PIPELINE_`` variables
    (``extra``: more variables).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    return env | {
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": redis_url,
        "PIPELINE_TOPICS_DIR": str(topics_dir or tmp_path / "topics"),
        "PIPELINE_INGRESS__SOURCES_FILE": str(tmp_path / "sources.yaml"),
        "PIPELINE_INGRESS__SQLITE_PATH": str(tmp_path / "ingress.db"),
        "PIPELINE_INGRESS__SWEEPER__ENABLED": "false",
        **extra,
    }


def start_ingress(
    env: dict[str, str],
    *options: str,
    cwd: Path | None = None,
    stderr: IO[str] | int = subprocess.PIPE,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.Popen[str]:
    """``pipeline ingress serve OPTIONS --port 0``; its stdout is a pipe, its first line says where.

    ``stderr``: a pipe unless given; ``preexec_fn``: run in the child before it execs.
    """
    return subprocess.Popen(
        [PIPELINE, "ingress", "serve", *options, "--port", "0"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        preexec_fn=preexec_fn,  # noqa: PLW1509 - a caller's only sets a limit, before exec
    )


def start_empty_ingress(tmp_path: Path, redis_url: str, **extra: str) -> subprocess.Popen[str]:
    """``pipeline ingress serve --port 0`` with no sources on Redis (``extra``: more variables).

    Its stdout and stderr are pipes; the first stdout line says where it listens.
    """
    (tmp_path / "sources.yaml").write_text("sources: {}\n", encoding="utf-8")
    return start_ingress(ingress_env(tmp_path, redis_url, ROOT / "topics", **extra), cwd=tmp_path)


def listening_url(proc: subprocess.Popen[str], log: Path | None = None) -> str:
    """The URL ``proc`` (from :func:`start_ingress`) listens on, from its first stdout line.

    Fails with that line, or the text of ``log`` (where its stderr goes) when given.
    """
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(LISTENING), log.read_text(encoding="utf-8") if log else line
    return line.removeprefix(LISTENING).strip()


def stop(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    """SIGTERM to ``proc``, then reap it; killed, and a failure, if alive after ``timeout_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the ingress did not end within {timeout_s} s of SIGTERM") from None


@contextmanager
def stopped(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """``proc`` for the ``with`` block, :func:`stop`-ped at its end, pass or fail."""
    try:
        yield proc
    finally:
        stop(proc)


@contextmanager
def killed_at_end() -> Iterator[list[subprocess.Popen[str]]]:
    """A list for the ingress processes a test starts; those still running at the end are killed.

    Killed with their workers; each is reaped, which also closes its pipes (of a process that
    ended by itself too).
    """
    procs: list[subprocess.Popen[str]] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
                proc.kill()
            proc.communicate()


def write_example_sources(directory: Path) -> Path:
    """``directory/sources.yaml``: a copy of ``deploy/local/sources.example.yaml``; its path."""
    sources = directory / "sources.yaml"
    sources.write_text((ROOT / "deploy/local/sources.example.yaml").read_text(encoding="utf-8"))
    return sources


def serve_until_listening(
    env: dict[str, str],
    started: list[subprocess.Popen[str]],
    *options: str,
    timeout_s: float = 60.0,
) -> tuple[subprocess.Popen[str], str]:
    """Start ``pipeline ingress serve OPTIONS --port 0`` into ``started``; its URL once listening.

    Fails, with its stderr, when it exits or does not listen within ``timeout_s``.
    """
    proc = start_ingress(env, *options)
    started.append(proc)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if line.startswith(LISTENING):
                return proc, line.removeprefix(LISTENING).strip()
    proc.kill()
    _, stderr = proc.communicate()
    raise AssertionError(f"the ingress did not start: {stderr}")


def listened_then_stopped(
    argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float = 60.0
) -> tuple[bool, subprocess.CompletedProcess[str]]:
    """Run the ingress start ``argv`` until it listens, ends or ``timeout_s`` passes; then stop it.

    Whether a stdout line said it listened, and how it ended: SIGTERM-ed if still running,
    reaped with its remaining stdout and its stderr. Killed, and a failure, if it did not end
    within ``timeout_s`` of SIGTERM.
    """
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    listened = False
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not listened:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline()
                listened = line.startswith(LISTENING)
                if not line:
                    break
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AssertionError("the ingress did not end after SIGTERM") from None
    return listened, subprocess.CompletedProcess(argv, proc.returncode, out, err)


def write_topics(directory: Path, topics: dict[str, str]) -> Path:
    """Write one declaration per topic (name -> lane) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, lane in topics.items():
        (directory / f"{name}.yaml").write_text(
            yaml.safe_dump({"name": name, "partitions": 2, "lane": lane}), encoding="utf-8"
        )
    return directory


def write_sources(path: Path, sources: dict[str, Any]) -> Path:
    """Write a sources file."""
    path.write_text(yaml.safe_dump({"sources": sources}), encoding="utf-8")
    return path


def one_lane_ingress(
    tmp_path: Path,
    lane: dict[str, Any],
    sources: dict[str, Any],
    transport: str = "redis",
    **ingress: Any,
) -> tuple[Settings, IngressSettings]:
    """The settings of an ingress over one lane, its files written in ``tmp_path``.

    ``lane`` is its only topics/t.yaml, ``sources`` its sources.yaml, its log tmp_path/ingress.db;
    on ``transport``, the sweeper off unless ``ingress`` (more ingress settings) says otherwise.
    """
    topics = tmp_path / "topics"
    topics.mkdir(exist_ok=True)
    (topics / "t.yaml").write_text(yaml.safe_dump(lane), encoding="utf-8")
    settings = test_settings(topics_dir=topics, transport=transport)
    config = IngressSettings(
        sources_file=write_sources(tmp_path / "sources.yaml", sources),
        sqlite_path=tmp_path / "ingress.db",
        **{"sweeper": SweeperSettings(enabled=False), **ingress},
    )
    return settings, config


async def built_with_topics(settings: Settings, config: IngressSettings) -> Ingress:
    """:func:`build_ingress` of ``config``; its topics made on the broker, deleted after the test.

    The topics are those of its declared lanes (``built.specs``), on ``settings``' broker.
    """
    built = build_ingress(settings, config)
    broker = create_transport(settings)
    delete_after_test(broker, [name for spec in built.specs for name in spec.topic_names()])
    try:
        await apply(broker.admin(), built.specs, 1000, dry_run=False)
    finally:
        await broker.close()
    return built


def write_whatsapp_source(tmp_path: Path, topic: str, secret: str) -> None:
    """Write ``tmp_path``'s topics/ and sources.yaml: the source ``whatsapp``, all to ``topic``.

    A Meta source whose deliveries are signed with ``secret``; ``topic`` is on lane messages.
    """
    write_topics(tmp_path / "topics", {topic: "messages"})
    source = {**META, "secrets": [secret], "topic": topic, "routes": []}
    write_sources(tmp_path / "sources.yaml", {"whatsapp": source})


def whatsapp_ingress_env(
    tmp_path: Path, redis_url: str, topic: str, secret: str, **extra: str
) -> dict[str, str]:
    """:func:`ingress_env` of an ingress with :func:`write_whatsapp_source`'s files written."""
    write_whatsapp_source(tmp_path, topic, secret)
    return ingress_env(tmp_path, redis_url, None, **extra)


@asynccontextmanager
async def volume_ingress_env(
    tmp_path: Path, volume: Path, redis_url: str, unique: str, secret: str
) -> AsyncIterator[dict[str, str]]:
    """An ingress on Redis Streams with its log on ``volume``: a topic of its own, made here."""
    topic = f"messages-{unique}"
    transport = create_transport(test_settings(), "redis")
    await transport.admin().create_topic(TopicConfig(topic, 2))
    try:
        log = {"PIPELINE_INGRESS__SQLITE_PATH": str(volume / "ingress.db")}
        yield whatsapp_ingress_env(tmp_path, redis_url, topic, secret, **log)
    finally:
        await transport.admin().delete_topic(topic)
        await transport.close()


class Webhooks:
    """A served ingress's HTTP side: signed Meta deliveries numbered on, and its ``/readyz``.

    Remembers the event ids of the deliveries answered 2xx.
    """

    def __init__(self, http: httpx.AsyncClient, secret: str, size: int = 0) -> None:
        """Send through ``http`` deliveries of about ``size`` bytes, signed with ``secret``."""
        self.http = http
        self.secret = secret
        self.size = size
        self.next = 0
        self.accepted: list[str] = []

    async def send(self) -> httpx.Response:
        """POST the next delivery to ``/hooks/whatsapp``."""
        body = meta_body(self.next, size=self.size)
        self.next += 1
        headers = {"x-hub-signature-256": hub_signature(self.secret, body)}
        answer = await self.http.post("/hooks/whatsapp", content=body, headers=headers)
        if answer.is_success:
            self.accepted.append(f"wamid.{self.next - 1}")
        return answer

    async def send_accepted(self, count: int) -> None:
        """Send ``count`` deliveries; each must be answered 200."""
        for _ in range(count):
            assert (await self.send()).status_code == 200

    async def ready(self) -> int:
        """The status of ``/readyz``."""
        return (await self.http.get("/readyz")).status_code

    async def until_ready(self, timeout_s: float = 30.0) -> None:
        """Poll ``/readyz`` until it answers 200; fail after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while await self.ready() != 200:
            assert time.monotonic() < deadline, "/readyz did not answer 200 again"
            await asyncio.sleep(0.05)


@asynccontextmanager
async def serving(
    env: dict[str, str], started: list[subprocess.Popen[str]], secret: str, size: int = 0
) -> AsyncIterator[tuple[subprocess.Popen[str], Webhooks]]:
    """An ingress :func:`serve_until_listening` (into ``started``), and :class:`Webhooks` to it.

    The event loop runs while it starts (a relay in it may carry its connections); the process is
    left running at the end of the block: :func:`terminated` ends it.
    """
    proc, url = await asyncio.to_thread(serve_until_listening, env, started)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        yield proc, Webhooks(http, secret, size)


async def terminated(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> str:
    """SIGTERM to ``proc``, then its stderr once it ended (within ``timeout_s``)."""
    proc.terminate()
    _, stderr = await asyncio.to_thread(proc.communicate, timeout=timeout_s)
    return stderr


def build(
    tmp_path: Path,
    sources: dict[str, Any],
    topics: dict[str, str],
    admission: IngressSlotSettings | None = None,
) -> dict[str, Source]:
    """Sources built through the real configuration path (files, validation, compilation)."""
    specs = load_specs(write_topics(tmp_path / "topics", topics))
    configs = load_sources(
        write_sources(tmp_path / "sources.yaml", sources), {s.name for s in specs}
    )
    return build_sources(
        configs,
        specs,
        admission=admission or IngressSlotSettings(),
        max_message_bytes=MAX_MESSAGE_BYTES,
    )


def client(
    sources: dict[str, Source], store: IngressLog, dispatcher: Dispatcher | None = None
) -> tuple[IngressApp, httpx.AsyncClient]:
    """The app and an HTTP client speaking ASGI to it in process."""
    app = IngressApp(sources, store, dispatcher)
    transport = httpx.ASGITransport(app=app)
    return app, httpx.AsyncClient(transport=transport, base_url="http://ingress")


META = {
    "scheme": "meta",
    "secrets": ["meta-app-secret"],
    "verify_token": "let-me-in",
    "tenant": {"pointer": "/entry/0/id"},
    "key": {"pointer": "/entry/0/changes/0/value/contacts/0/wa_id"},
    "event_id": {"pointer": "/entry/0/changes/0/value/messages/0/id"},
    "topic": "messages",
    "routes": [
        {
            "when": {"pointer": "/entry/*/changes/*/field", "in": ["comments", "feed"]},
            "topic": "engagement",
        },
    ],
}


def meta_body(n: int, field: str = "messages", size: int = 0) -> bytes:
    """A WhatsApp-like payload numbered ``n``, padded to about ``size`` bytes."""
    change = {
        "field": field,
        "value": {
            "contacts": [{"wa_id": f"wa-{n % 7}"}],
            "messages": [{"id": f"wamid.{n}", "text": {"body": "x" * max(0, size - 200)}}],
        },
    }
    return json.dumps(
        {"object": "whatsapp_business_account", "entry": [{"id": "biz-1", "changes": [change]}]}
    ).encode()


async def sweep_a_row_produced_ago(
    redis: Transport, tmp_path: Path, spec: TopicSpec, group: str, ago_s: float
) -> tuple[SweepReport, LogRow | None]:
    """Sweep once a log holding one row of ``spec``'s lane produced ``ago_s`` ago."""
    clock = FakeClock(start_s=time.time() - ago_s)
    store = SqliteLogStore(tmp_path / "log.db", clock=clock)
    await store.open()
    try:
        row = new_row(1, clock, topic=spec.name, lane=spec.lane)
        await store.insert(row)
        await store.mark_produced([row.id])
        ingress = IngressSettings(
            sweeper=SweeperSettings(
                patience_s=300, max_patience_s=900, lane_groups={spec.lane: group}
            )
        )
        sweeper = build_sweeper(store, redis.producer(), redis.admin(), [spec], ingress)
        return await sweeper.sweep_once(), await store.get(row.id)
    finally:
        await store.close()


QUICK = RuntimeSettings(
    commit_interval_ms=100, shutdown_grace_s=0.2, cancel_poll_ms=50, cancel_grace_s=0.1
)
"""A member's settings for the sweeper tests: quick commit ticks and a short shutdown."""


async def ticks(member: Member, count: int) -> None:
    """Wait until ``member`` has made ``count`` more commit ticks."""
    target = member._ticks + count
    await eventually(lambda: member._ticks >= target)


async def started_and_stopped(
    tmp_path: Path, lane: dict[str, Any], sources: dict[str, Any]
) -> set[str]:
    """Start an ingress over one lane and ``sources`` (Redis, sweeper off), then stop it.

    ``lane`` is the lane's topics/*.yaml; returns the names of the metric sources it refreshed.
    """
    built = build_ingress(*one_lane_ingress(tmp_path, lane, sources))
    try:
        await built.start()
        return {source.name for source in built.observer.sources}
    finally:
        await built.stop()


def evicted(sock: socket.socket) -> bool:
    """Whether the server answered ``sock`` (a 503 when evicted) or closed it.

    ``sock`` is left non-blocking; nothing it holds is read.
    """
    sock.setblocking(False)  # noqa: FBT003 - the socket API
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    except ConnectionError:
        return True
    return True
