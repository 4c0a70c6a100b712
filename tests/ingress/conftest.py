"""Fixtures for the ingress tests: a real SQLite log store, the ingress processes a test started."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psutil
import pytest

from pipeline.logstore.sqlite import SqliteLogStore


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteLogStore]:
    """An open SQLite log store in the test's directory."""
    store = SqliteLogStore(tmp_path / "ingress.db")
    await store.open()
    yield store
    await store.close()


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Ingress processes a test started; any still running at the end is killed with its workers."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.communicate()
