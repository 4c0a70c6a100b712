"""``pipeline tail`` on Redis with one partition's stream key overwritten.

A 4-partition topic whose partition 1 key another program overwrote with a string: the tail
failed at once (exit 1, a line naming no key) and printed nothing of partitions 0, 2 and 3. It
now prints them, with one line on stderr naming the partition, its key and `redis-cli DEL`; it
exits as any tail does (SIGTERM: 143, after its line of how many it printed).

A redrive of such a DLQ: tests/redrive/test_redrive_bad_dlq_key.py.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

from redis.asyncio import Redis
from support import cli_environment

from pipeline.config import Settings
from pipeline.transport.protocol import TopicConfig, Transport

PARTITIONS = 4
BAD = 1
PER_PARTITION = 3
BOUND_S = 60.0
"""A bound on what must come, never a measure."""


def _stream(settings: Settings, topic: str, partition: int) -> str:
    return f"{{{settings.redis.key_prefix}:{topic}:{partition}}}:s"


async def test_tail_prints_the_healthy_partitions_and_names_the_bad_key(
    tmp_path: Path, streams: Transport, settings: Settings, redis: Redis, unique: str
) -> None:
    """Partitions 0, 2, 3 printed; one line names partition 1, its key and `redis-cli DEL`."""
    topic = f"tailbad_{unique}"
    admin = streams.admin()
    await admin.create_topic(TopicConfig(topic, PARTITIONS))
    try:
        producer = streams.producer()
        for p in range(PARTITIONS):
            for i in range(PER_PARTITION):
                await producer.send(topic, b"m-%d-%d" % (p, i), key=b"k", partition=p)
        await producer.close()
        stream = _stream(settings, topic, BAD)
        await redis.set(stream, b"not a stream")
        healthy = {f"m-{p}-{i}" for p in range(PARTITIONS) if p != BAD for i in range(3)}

        command = [sys.executable, "-m", "pipeline", "tail", topic, "--from-beginning"]
        pipe = asyncio.subprocess.PIPE
        env = cli_environment(tmp_path)
        tail = await asyncio.create_subprocess_exec(
            *command, "-t", "redis", env=env, stdout=pipe, stderr=pipe
        )
        assert tail.stdout is not None
        printed: list[str] = []
        try:
            deadline = time.monotonic() + BOUND_S
            while not healthy <= {line.strip() for line in printed}:
                left_s = deadline - time.monotonic()
                assert left_s > 0, printed
                line = await asyncio.wait_for(tail.stdout.readline(), left_s)
                assert line, (printed, await tail.communicate())  # ended before printing all
                printed.append(line.decode())
            tail.send_signal(signal.SIGTERM)
            rest, err = await asyncio.wait_for(tail.communicate(), BOUND_S)
        finally:
            if tail.returncode is None:
                tail.kill()
                await tail.communicate()
        values = [line.strip() for line in [*printed, *rest.decode().splitlines()]]
        assert sorted(v for v in values if v.startswith("m-")) == sorted(healthy)
        assert tail.returncode == 128 + signal.SIGTERM, err.decode()
        lines = err.decode().splitlines()
        naming = [line for line in lines if stream in line]
        assert len(naming) == 1, lines
        assert f"partition {topic}[{BAD}] is not read" in naming[0], naming
        assert f"`redis-cli DEL {stream}`" in naming[0], naming
        assert lines[-1] == f"error: tail of {topic} stopped by SIGTERM after 9 messages", lines
        assert len(lines) == 2, lines
    finally:
        await admin.delete_topic(topic)
