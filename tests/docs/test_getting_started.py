"""docs/getting-started.md, run as written against real Redis: a signed webhook gets handled."""

from __future__ import annotations

import shutil
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from shell import Session, blocks, copy_env

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "getting-started.md"

# `make setup` and `make services` are this suite's own preconditions (its venv and services);
# `make demo` has its own test (tests/demo).
SKIPPED = {
    "make setup": "the test runs in the project's venv",
    "make services": "the suite's services are already up",
    "make demo": "tests/demo runs the demo",
}
LONG_RUNNING = ("pipeline ingress serve", "pipeline consume")


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def workdir(tmp_path: Path) -> Path:
    """A checkout as far as the guide reads it: declarations, consumers, examples, the venv."""
    for part in ("topics", "consumers", "deploy/local"):
        shutil.copytree(ROOT / part, tmp_path / part)
    venv = Path(sys.prefix)
    if (venv / "bin" / "activate").exists():
        (tmp_path / ".venv").symlink_to(venv)
    else:  # not run from a venv: an activate that puts this interpreter's scripts first
        (tmp_path / ".venv" / "bin").mkdir(parents=True)
        bindir = Path(sys.executable).parent
        (tmp_path / ".venv" / "bin" / "activate").write_text(f'export PATH="{bindir}:$PATH"\n')
    return tmp_path


@pytest.fixture
async def prefix(redis: Redis) -> AsyncIterator[str]:
    """A Redis key prefix of the run's own; every key under it is deleted afterwards."""
    name = f"doc{uuid.uuid4().hex[:10]}"
    yield name
    async for key in redis.scan_iter(match=f"*{name}*", count=1000):
        await redis.delete(key)


@pytest.mark.timeout(240)
async def test_the_guide_runs_as_written(
    tmp_path: Path, prefix: str, redis: Redis, settings
) -> None:
    """Every sh block of the guide runs, prints what the guide shows, and leaves no keys behind."""
    port = free_port()
    redis_url = settings.redis.url

    def rewrite(text: str) -> str:
        return text.replace("127.0.0.1:8080", f"127.0.0.1:{port}").replace(
            "redis://127.0.0.1:6379/0", redis_url
        )

    def skip(command: str) -> str | None:
        return next((why for start, why in SKIPPED.items() if command.startswith(start)), None)

    env = copy_env(
        PIPELINE_TRANSPORT="redis",
        PIPELINE_REDIS__URL=redis_url,
        PIPELINE_REDIS__KEY_PREFIX=prefix,
        PIPELINE_INGRESS__PORT=str(port),
    )
    env.pop("PIPELINE_LOG_LEVEL", None)
    session = Session(
        workdir(tmp_path),
        env,
        background=lambda command: command.startswith(LONG_RUNNING),
        skip=skip,
        rewrite=rewrite,
    )
    ran = 0
    try:
        for block in blocks(GUIDE.read_text(encoding="utf-8")):
            session.run(block)
            ran += len(block.steps) + len(block.shown)
    finally:
        codes = session.close()
    transcript = "\n".join(session.transcript)
    assert ran >= 15, transcript
    assert [c.split()[:2] for c in codes] == [["pipeline", "consume"], ["pipeline", "ingress"]]
    for command, code in codes.items():
        assert code in {0, 130}, f"{command} exited {code} on Ctrl-C"  # 130: stopped by SIGINT
    for background in session.running:
        assert "Traceback" not in background.output, background.output
    consumer = session.running[1].output
    assert "dead letter on lane messages" in consumer
    assert await redis.exists(f"{prefix}:topics")
