"""``pipeline ingress serve`` whose SQLite log sits on a volume that fills up, then has room again.

The volume is a real one: a 2 MiB tmpfs, mounted for the test (root with CAP_SYS_ADMIN only).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import sqlite3
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ingress.helpers import PIPELINE, serving, terminated, volume_ingress_env

SECRET = "disk-full-secret"  # noqa: S105 - a test secret
ADVICE = "free space on the volume of"


def fill(path: Path) -> None:
    """Write ``path`` until its volume has no byte left."""
    with path.open("wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise


@pytest.fixture
async def env(
    tmp_path: Path, volume: Path, redis_service: str, unique: str
) -> AsyncIterator[dict[str, str]]:
    """An ingress on Redis Streams with its log on ``volume``: a topic of its own, made here."""
    async with volume_ingress_env(tmp_path, volume, redis_service, unique, SECRET) as variables:
        yield variables


def stored_event_ids(database: Path) -> set[str]:
    """The event ids of the log's rows, read without writing."""
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        return {event_id for (event_id,) in db.execute("SELECT event_id FROM ingress_log")}


async def test_a_full_volume_answers_503_turns_unready_says_so_once_and_recovers(
    env: dict[str, str], volume: Path, started: list[subprocess.Popen[str]]
) -> None:
    """Full: 503 with Retry-After, /readyz 503, one line naming the volume; freed: it recovers."""
    async with serving(env, started, SECRET, size=2000) as (proc, hooks):
        await hooks.send_accepted(5)
        fill(volume / "filler")
        answers = [await hooks.send() for _ in range(20)]
        assert {a.status_code for a in answers} == {503}, [a.text for a in answers]
        assert all(a.headers.get("retry-after") for a in answers)
        assert {a.json()["error"] for a in answers} == {"log store unavailable"}
        assert await hooks.ready() == 503  # a load balancer stops sending
        (volume / "filler").unlink()
        await hooks.until_ready()  # by itself: nothing is sent to it meanwhile
        assert (await hooks.send()).status_code == 200
        assert await hooks.ready() == 200
    stderr = await terminated(proc)
    full_lines = [line for line in stderr.splitlines() if ADVICE in line]
    assert full_lines, stderr
    assert len(full_lines) <= 3, stderr  # said once (and the unready line), not per request
    assert str(volume / "ingress.db") in full_lines[0]
    assert set(hooks.accepted) <= stored_event_ids(volume / "ingress.db")


async def test_a_purge_on_a_full_volume_says_what_to_do(
    env: dict[str, str], volume: Path, started: list[subprocess.Popen[str]]
) -> None:
    """A purge that cannot write (SQLite's delete needs room too) names the volume to free."""
    async with serving(env, started, SECRET, size=2000) as (proc, hooks):
        await hooks.send_accepted(3)
    await terminated(proc)
    fill(volume / "filler")
    done = await asyncio.to_thread(
        subprocess.run,
        [PIPELINE, "purge", "--older-than", "2999-01-01T00:00:00Z", "--state", "received"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert ADVICE in done.stderr, done.stderr
