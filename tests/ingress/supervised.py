"""What the tests of ``pipeline ingress serve --workers N`` share: a setup and its workers."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import psycopg
from contract.helpers import make_topic
from ingress.helpers import write_whatsapp_source

from pipeline.config import Settings
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport


@dataclass
class Setup:
    """One test's topic, PostgreSQL schema and environment for ``pipeline ingress serve``."""

    topic: str
    schema: str
    env: dict[str, str]
    transport: Transport


@asynccontextmanager
async def workers_setup(
    tmp_path: Path,
    settings: Settings,
    redis_service: str,
    postgres_service: str,
    unique: str,
    secret: str,
) -> AsyncIterator[Setup]:
    """A Redis topic and a PostgreSQL schema of the test's own, both removed after it.

    The ingress verifies the source ``whatsapp`` (Meta's scheme) with ``secret``; its sweeper is
    off.
    """
    topic = f"messages-{unique}"
    schema = f"w_{uuid.uuid4().hex[:12]}"
    transport = create_transport(settings, "redis")
    await make_topic(transport, topic, 2)
    write_whatsapp_source(tmp_path, topic, "env:PIPELINE_TEST_WORKERS_SECRET")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env |= {
        "PIPELINE_TEST_WORKERS_SECRET": secret,
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": redis_service,
        "PIPELINE_POSTGRES__URL": postgres_service,
        "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
        "PIPELINE_INGRESS__SOURCES_FILE": str(tmp_path / "sources.yaml"),
        "PIPELINE_INGRESS__LOG_STORE": "postgres",
        "PIPELINE_INGRESS__POSTGRES_SCHEMA": schema,
        "PIPELINE_INGRESS__SWEEPER__ENABLED": "false",
    }
    try:
        yield Setup(topic, schema, env, transport)
    finally:
        await transport.admin().delete_topic(topic)
        await transport.close()
        async with await psycopg.AsyncConnection.connect(postgres_service, autocommit=True) as c:
            await c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def workers_of(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    """The supervisor's live worker processes (not multiprocessing's resource tracker).

    A killed worker the supervisor has not reaped yet is a zombie: not a worker any more.
    """
    workers = []
    for child in psutil.Process(proc.pid).children():
        try:
            command = " ".join(child.cmdline())
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue
        if "resource_tracker" not in command:
            workers.append(child)
    return workers
