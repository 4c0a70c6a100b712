"""`pipeline consume` warns at start when its Redis persists nothing held followers need."""

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
from contextlib import contextmanager
from pathlib import Path

import pytest
from redis.asyncio import Redis

from pipeline.runtime import App, Context
from pipeline.runtime.app import Lane
from pipeline.runtime.persistence import warn_if_not_persisting
from pipeline.testing.ports import free_port
from pipeline.topics.spec import TopicSpec

ORDERED_APP = '''
from pipeline.runtime import App, Context

app = App()


@app.handler("{lane}")
async def handle(event: bytes, ctx: Context) -> None:
    """Nothing: the test stops the member before anything is produced."""
'''
NO_PERSISTENCE = ("--appendonly", "no", "--save", "")


@contextmanager
def private_redis(*options: str) -> Iterator[str]:
    """The URL of a private redis-server started with ``options``, stopped at the end."""
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise AssertionError(f"redis-server on port {port} did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


def lane(name: str, **fields: object) -> Lane:
    """A one-partition lane of an App of its own, declared with ``fields``."""
    app = App([TopicSpec.model_validate({"name": name, "partitions": 1, **fields})])

    @app.handler(name)
    async def handle(event: bytes, ctx: Context) -> None:
        """Never called."""

    return app.lanes[name]


async def test_consume_warns_once_when_its_redis_persists_nothing(
    tmp_path: Path, unique: str
) -> None:
    """Appendonly no, save "": one WARNING line: the URL, what a restart loses, the fix."""
    name = f"persist_{unique}"
    (tmp_path / "topics").mkdir()
    (tmp_path / "topics" / f"{name}.yaml").write_text(
        f"name: {name}\npartitions: 1\nordered: true\nretry:\n  tiers: [1s]\n"
    )
    (tmp_path / f"{name}.py").write_text(ORDERED_APP.format(lane=name))
    with private_redis(*NO_PERSISTENCE) as url:
        env = {
            **os.environ,
            "PIPELINE_TRANSPORT": "redis",
            "PIPELINE_REDIS__URL": url,
            "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
            "PIPELINE_MEMBERSHIP__SLOT_DIR": str(tmp_path / "slots"),
        }
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "pipeline", "consume", f"{name}:app", "-g", "g"),
            cwd=str(tmp_path),
            env=env,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stderr is not None
        lines: list[str] = []
        try:
            while not any("persists nothing" in line for line in lines):
                line = await asyncio.wait_for(proc.stderr.readline(), 60)
                assert line, "".join(lines)  # the member ended without the warning
                lines.append(line.decode())
            proc.send_signal(signal.SIGTERM)
            _, rest = await asyncio.wait_for(proc.communicate(), 60)
            lines += rest.decode().splitlines(keepends=True)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    warned = [line for line in lines if "persists nothing" in line]
    assert len(warned) == 1, "".join(lines)
    [line] = warned
    assert "WARNING" in line
    assert url in line
    assert f"held followers of parked keys (lanes {name})" in line
    assert "whose offsets are committed" in line
    assert "set appendonly yes and appendfsync everysec" in line


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(("--appendonly", "yes", "--save", ""), id="appendonly"),
        pytest.param(("--appendonly", "no", "--save", "3600 1"), id="snapshots"),
        pytest.param((*NO_PERSISTENCE, "--rename-command", "CONFIG", ""), id="config-refused"),
    ],
)
async def test_no_word_when_redis_persists_or_refuses_config(
    options: tuple[str, ...], tmp_path: Path, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An append-only file, snapshots, or CONFIG refused (as managed Redis do): nothing logged."""
    lanes = [lane(f"held_{unique}", retry={"tiers": ["1s"]})]
    with private_redis("--dir", str(tmp_path), *options) as url:
        client = Redis.from_url(url)
        try:
            with caplog.at_level(logging.WARNING, logger="pipeline.runtime.persistence"):
                assert await warn_if_not_persisting(client, url, lanes) is None
        finally:
            await client.aclose()
    assert not caplog.records


async def test_lanes_keeping_nothing_only_in_redis_get_no_word(
    unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Unordered or without retry tiers, nothing debounced: a restart loses no message."""
    lanes = [
        lane(f"plain_{unique}"),
        lane(f"free_{unique}", ordered=False, retry={"tiers": ["1s"]}),
    ]
    with private_redis(*NO_PERSISTENCE) as url:
        client = Redis.from_url(url)
        try:
            with caplog.at_level(logging.WARNING, logger="pipeline.runtime.persistence"):
                assert await warn_if_not_persisting(client, url, lanes) is None
        finally:
            await client.aclose()
    assert not caplog.records


async def test_debounced_lanes_are_named_with_their_buffers(unique: str) -> None:
    """A debounced lane: its buffers are what a restart loses."""
    name = f"deb_{unique}"
    quiet = {"key": "conversation_id", "quiet_s": 3600, "max_wait_s": 3600}
    app = App([TopicSpec.model_validate({"name": name, "partitions": 1, "debounce": quiet})])

    @app.handler(name)
    async def turn(events: list[bytes], ctx: Context) -> None:
        """Never called."""

    lanes = [app.lanes[name]]
    with private_redis(*NO_PERSISTENCE) as url:
        client = Redis.from_url(url)
        try:
            line = await warn_if_not_persisting(client, url, lanes)
        finally:
            await client.aclose()
    assert line is not None
    assert f"debounce buffers (lanes deb_{unique})" in line
