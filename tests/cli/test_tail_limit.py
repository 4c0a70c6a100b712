"""`pipeline tail --from-beginning --limit N` on a topic holding fewer than N messages ends."""

from __future__ import annotations

import asyncio
import os
import sys

from pipeline.transport.protocol import TopicConfig, Transport


async def test_tail_stops_after_what_the_topic_holds(transport: Transport, unique: str) -> None:
    """With one message retained, --limit 5 prints it and exits 0 instead of waiting forever."""
    topic = f"tail_{unique}"
    admin = transport.admin()
    await admin.create_topic(TopicConfig(topic, 2))
    producer = transport.producer()
    try:
        await producer.send(topic, b"only one", key=b"k")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pipeline",
            "tail",
            topic,
            "--from-beginning",
            "--limit",
            "5",
            "-t",
            transport.name,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(os.environ),
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    finally:
        await producer.close()
        await admin.delete_topic(topic)
    assert process.returncode == 0, stderr.decode()
    assert "only one" in stdout.decode()
    assert b"Traceback" not in stderr
