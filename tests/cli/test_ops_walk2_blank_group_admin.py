"""The Kafka admin given a blank consumer group refuses it instead of aborting the process.

A lag read opens a consumer of the group (it never joins it) to read its committed offsets:
with a blank ``group.id`` librdkafka's consumer failed an assertion and the whole process died
(exit 134, no line). ``group_lag`` and ``delete_group`` given a blank or whitespace group raise
a ConfigError naming the group argument. Run in a child process: the abort would take the test
run with it.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
from runtime.helpers import declare, lane_spec

from pipeline.transport.protocol import Transport

_CALL = """
import asyncio, sys
from pipeline.config import load_settings
from pipeline.errors import ConfigError
from pipeline.transport.kafka.admin import KafkaAdmin

async def main(call: str, group: str, topic: str) -> None:
    admin = KafkaAdmin(load_settings().kafka)
    try:
        if call == "lag":
            await admin.group_lag(group, topic)
        else:
            await admin.delete_group(group, [topic])
    except ConfigError as exc:
        print(f"ConfigError: {exc}")
    else:
        print("no error")

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.parametrize("call", ["lag", "delete"])
@pytest.mark.parametrize("group", ["", "  "])
async def test_a_blank_group_is_refused_naming_it(
    call: str, group: str, kafka: Transport, unique: str
) -> None:
    """No abort: a ConfigError naming the group argument as given, and what to give instead."""
    spec = lane_spec(f"w2blank_{unique}", 1)
    await declare(kafka, spec)
    child = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", _CALL, call, group, spec.name),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == 0, f"{child.returncode}: {out.decode()}{err.decode()}"
    (line,) = out.decode().splitlines()
    assert line.startswith(f"ConfigError: group {group!r}: a consumer group needs a name"), line
