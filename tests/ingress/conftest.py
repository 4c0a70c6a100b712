"""Fixtures for the ingress tests: real log stores, the ingress processes a test started."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from ingress.helpers import killed_at_end
from logstore.helpers import FakeClock, real_log_store

from pipeline.config import Settings
from pipeline.logstore import LogStore
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
    with killed_at_end() as procs:
        yield procs


@pytest.fixture
def clock() -> FakeClock:
    """A clock the test moves by hand (the log store's and the sweeper's)."""
    return FakeClock()


@pytest.fixture(params=["sqlite", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, settings: Settings, clock: FakeClock
) -> AsyncIterator[LogStore]:
    """A real, empty log store of each kind on the test's clock."""
    if request.param == "postgres":
        request.getfixturevalue("postgres_service")
    async with real_log_store(request.param, tmp_path, settings.postgres.url, clock) as log:
        yield log


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """A directory on a 2 MiB tmpfs of the test's own, unmounted after it (full volumes)."""
    mount = tmp_path / "volume"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root with CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        with contextlib.suppress(OSError):
            mount.rmdir()
