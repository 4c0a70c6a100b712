"""Fixtures for the ingress tests: a real SQLite log store per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pipeline.logstore.sqlite import SqliteLogStore


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteLogStore]:
    """An open SQLite log store in the test's directory."""
    store = SqliteLogStore(tmp_path / "ingress.db")
    await store.open()
    yield store
    await store.close()
