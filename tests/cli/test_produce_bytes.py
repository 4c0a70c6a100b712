"""`pipeline produce` given command-line bytes that are not UTF-8 (Linux argv, surrogateescape)."""

from __future__ import annotations

import asyncio
import os
import sys

from contract.helpers import make_topic

from pipeline.transport.protocol import Transport


def typed(raw: bytes) -> str:
    r"""``raw`` as Python hands it over when typed on the command line (``$'a\xffb'``)."""
    return raw.decode(errors="surrogateescape")


async def produce(*args: str) -> tuple[int, str, str]:
    """Run ``pipeline produce ARGS``; its exit code, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pipeline",
        "produce",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ),
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode(errors="replace")


async def test_a_topic_not_utf8_is_one_line(transport: Transport) -> None:
    """A topic name with bytes that are not UTF-8 exits 2 with one line naming it, no traceback."""
    code, _, stderr = await produce(typed(b"a\xffb"), "--value", "x", "-t", transport.name)
    lines = stderr.strip().splitlines()
    assert code == 2, stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: topic 'a\\xffb'"), lines


async def test_key_value_and_header_bytes_are_sent_as_typed(
    transport: Transport, unique: str
) -> None:
    """A key, value and header value that are not UTF-8 are produced as the bytes typed."""
    topic = f"produce_bytes_{unique}"
    await make_topic(transport, topic, 1)
    code, _, stderr = await produce(
        topic,
        "--key",
        typed(b"k\xff"),
        "--value",
        typed(b"v\xfe"),
        "-H",
        typed(b"tenant=t\xfd"),
        "-t",
        transport.name,
    )
    assert code == 0, stderr
    reader = transport.reader([topic])
    try:
        (message,) = await reader.poll(10, 10.0)
    finally:
        await reader.close()
    assert (message.key, message.value) == (b"k\xff", b"v\xfe")
    assert message.headers["tenant"] == b"t\xfd"


async def test_a_header_name_not_utf8_is_one_line() -> None:
    """A header name with bytes that are not UTF-8 exits 2 with one line naming -H."""
    code, _, stderr = await produce("t", "--value", "x", "-H", typed(b"n\xff=v"))
    lines = stderr.strip().splitlines()
    assert code == 2, stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: --header name 'n\\xff'"), lines
