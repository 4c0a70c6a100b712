"""`pipeline consume` warns at start when its Redis may evict held followers (maxmemory policy)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from pipeline.runtime import App, Context
from pipeline.runtime.app import Lane
from pipeline.runtime.eviction import warn_if_evicting
from pipeline.testing.ports import free_port
from pipeline.topics.spec import TopicSpec

ORDERED_APP = '''
from pipeline.runtime import App, Context

app = App()


@app.handler("{lane}")
async def handle(event: bytes, ctx: Context) -> None:
    """Nothing: the test stops the member before anything is produced."""
'''


def start_redis(*options: str) -> tuple[subprocess.Popen[bytes], str]:
    """A private redis-server on a free port with ``options``, once it answers; and its URL."""
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return process, f"redis://127.0.0.1:{port}/0"
        except OSError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            raise AssertionError(f"redis-server on port {port} did not start")
        time.sleep(0.05)


@pytest.fixture
def evicting_redis() -> Iterator[str]:
    """A private redis-server that evicts keys with an expiry when full (volatile-lru)."""
    process, url = start_redis("--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru")
    yield url
    process.terminate()
    process.wait(timeout=10)


def ordered_lane(name: str) -> Lane:
    """An ordered lane with retry tiers: a parked key's followers are held in Redis."""
    app = App(
        [TopicSpec.model_validate({"name": name, "partitions": 1, "retry": {"tiers": ["1s"]}})]
    )

    @app.handler(name)
    async def handle(event: bytes, ctx: Context) -> None:
        """Never called."""

    return app.lanes[name]


async def test_consume_warns_once_when_its_redis_evicts_keys_with_an_expiry(
    evicting_redis: str, tmp_path: Path, unique: str
) -> None:
    """With maxmemory and volatile-lru: one WARNING line: the URL, the policy, the loss, the fix."""
    lane = f"evict_{unique}"
    (tmp_path / "topics").mkdir()
    (tmp_path / "topics" / f"{lane}.yaml").write_text(
        f"name: {lane}\npartitions: 1\nordered: true\nretry:\n  tiers: [1s]\n"
    )
    (tmp_path / f"evict_{unique}.py").write_text(ORDERED_APP.format(lane=lane))
    env = {
        **os.environ,
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": evicting_redis,
        "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
        "PIPELINE_MEMBERSHIP__SLOT_DIR": str(tmp_path / "slots"),
    }
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "pipeline", "consume", f"evict_{unique}:app", "-g", "g"),
        cwd=str(tmp_path),
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        while not any("maxmemory-policy" in line for line in lines):
            line = await asyncio.wait_for(proc.stderr.readline(), 60)
            assert line, "".join(lines)  # the member ended without the warning
            lines.append(line.decode())
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    warned = [line for line in lines if "maxmemory" in line]
    assert len(warned) == 1, "".join(lines)
    [line] = warned
    assert "WARNING" in line
    assert evicting_redis in line
    assert "volatile-lru" in line
    assert f"held followers of parked keys (lanes {lane})" in line
    assert "set maxmemory-policy noeviction" in line


async def test_no_word_when_redis_refuses_config_or_never_evicts(
    unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis refusing CONFIG (as managed ones do), or one set to noeviction: nothing logged."""
    lanes = [ordered_lane(f"quiet_{unique}")]
    for options in (
        (
            "--maxmemory",
            "100mb",
            "--maxmemory-policy",
            "volatile-lru",
            *("--rename-command", "CONFIG", ""),
        ),
        ("--maxmemory", "100mb", "--maxmemory-policy", "noeviction"),
        ("--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"),
    ):
        process, url = start_redis(*options)
        client = Redis.from_url(url)
        try:
            with caplog.at_level(logging.WARNING, logger="pipeline.runtime.eviction"):
                assert await warn_if_evicting(client, url, lanes) is None
        finally:
            await client.aclose()
            process.terminate()
            process.wait(timeout=10)
    assert not caplog.records
