"""Helpers shared by the ingress tests: topic and source files, an app over a store, a sweep."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from logstore.helpers import FakeClock, new_row
from runtime.helpers import eventually
from support import test_settings

from pipeline.config import IngressSettings, IngressSlotSettings, RuntimeSettings, SweeperSettings
from pipeline.ingress.app import IngressApp
from pipeline.ingress.dispatch import Dispatcher
from pipeline.ingress.service import build_ingress, build_sweeper
from pipeline.ingress.settings import load_sources
from pipeline.ingress.source import Source, build_sources
from pipeline.ingress.sweeper import SweepReport
from pipeline.logstore import IngressLog, LogRow
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.runtime.member import Member
from pipeline.topics.spec import TopicSpec, load_specs
from pipeline.transport.protocol import Transport

MAX_MESSAGE_BYTES = 1_048_576 + 65_536
PIPELINE = Path(sys.executable).with_name("pipeline")
ROOT = Path(__file__).parents[2]


def start_empty_ingress(tmp_path: Path, redis_url: str, **extra: str) -> subprocess.Popen[str]:
    """``pipeline ingress serve --port 0`` with no sources on Redis (``extra``: more variables).

    Its stdout and stderr are pipes; the first stdout line says where it listens.
    """
    sources = tmp_path / "sources.yaml"
    sources.write_text("sources: {}\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env |= {
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": redis_url,
        "PIPELINE_TOPICS_DIR": str(ROOT / "topics"),
        "PIPELINE_INGRESS__SOURCES_FILE": str(sources),
        "PIPELINE_INGRESS__SQLITE_PATH": str(tmp_path / "ingress.db"),
        "PIPELINE_INGRESS__SWEEPER__ENABLED": "false",
        **extra,
    }
    return subprocess.Popen(
        [PIPELINE, "ingress", "serve", "--port", "0"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def serve_until_listening(
    env: dict[str, str],
    started: list[subprocess.Popen[str]],
    *options: str,
    timeout_s: float = 60.0,
) -> tuple[subprocess.Popen[str], str]:
    """Start ``pipeline ingress serve OPTIONS --port 0`` into ``started``; its URL once listening.

    Fails, with its stderr, when it exits or does not listen within ``timeout_s``.
    """
    proc = subprocess.Popen(
        [PIPELINE, "ingress", "serve", *options, "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started.append(proc)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("ingress listening on "):
                return proc, line.removeprefix("ingress listening on ").strip()
    proc.kill()
    _, stderr = proc.communicate()
    raise AssertionError(f"the ingress did not start: {stderr}")


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
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "t.yaml").write_text(yaml.safe_dump(lane), encoding="utf-8")
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({"sources": sources}), encoding="utf-8")
    settings = test_settings(topics_dir=topics, transport="redis")
    ingress = IngressSettings(
        sources_file=path, sqlite_path=tmp_path / "i.db", sweeper=SweeperSettings(enabled=False)
    )
    built = build_ingress(settings, ingress)
    try:
        await built.start()
        return {source.name for source in built.observer.sources}
    finally:
        await built.stop()
