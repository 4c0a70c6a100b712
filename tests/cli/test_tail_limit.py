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


async def test_a_topic_named_with_bytes_not_utf8_is_one_line(transport: Transport) -> None:
    """`tail` of a topic name with bytes that are not UTF-8 exits 2 with one line, no traceback."""
    typed = b"a\xffb".decode(errors="surrogateescape")  # how Python hands `$'a\xffb'` over
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pipeline",
        "tail",
        typed,
        "-t",
        transport.name,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ),
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    lines = stderr.decode(errors="replace").strip().splitlines()
    assert process.returncode == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: topic 'a\\xffb'"), lines


async def test_a_limit_past_any_batch_is_read_in_batches(transport: Transport, unique: str) -> None:
    """`tail --limit 10**30` prints what arrives, its first read not refused by the broker."""
    topic = f"tail_{unique}"
    admin = transport.admin()
    await admin.create_topic(TopicConfig(topic, 1))
    producer = transport.producer()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "pipeline", "tail", topic, "--limit", str(10**30)),
        *("-t", transport.name),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ),
    )
    assert process.stdout is not None
    try:
        # "latest" starts at the reader's first poll: send until one is printed or tail ends.
        line = asyncio.ensure_future(process.stdout.readline())
        while not line.done():
            await producer.send(topic, b"arrived", key=b"k")
            await asyncio.wait([line], timeout=0.5)
        printed = line.result()
    finally:
        if process.returncode is None:
            process.kill()  # it would tail on: what it printed is what is asserted
        _, stderr = await asyncio.wait_for(process.communicate(), 60)
        await producer.close()
        await admin.delete_topic(topic)
    assert printed.startswith(f"{topic}[0]@".encode()), stderr.decode(errors="replace")
