"""Fixtures for the tracing tests: the suite's own OTLP receiver, and tracing on towards it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from logstore.helpers import real_log_store
from tracing.otlp_receiver import OtlpReceiver

from pipeline import tracing
from pipeline.config import Settings
from pipeline.logstore import LogStore
from pipeline.logstore.sqlite import SqliteLogStore


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP receiver on a free port."""
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


@pytest.fixture
def traced(otlp: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """Tracing on, at 100 % sampling, exporting to ``otlp``; off again (flushed) afterwards."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp.endpoint)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    assert tracing.configure(os.environ, service="pipeline-test")
    yield otlp
    tracing.shutdown()


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteLogStore]:
    """An open SQLite log store in the test's directory."""
    store = SqliteLogStore(tmp_path / "ingress.db")
    await store.open()
    yield store
    await store.close()


@pytest.fixture(params=["sqlite", "postgres"])
async def log_store(
    request: pytest.FixtureRequest, tmp_path: Path, settings: Settings
) -> AsyncIterator[LogStore]:
    """Each real log store in turn; PostgreSQL in a schema of the test's own, dropped after."""
    if request.param == "postgres":
        request.getfixturevalue("postgres_service")
    async with real_log_store(request.param, tmp_path, settings.postgres.url) as store:
        yield store
