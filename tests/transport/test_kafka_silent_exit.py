"""A Kafka call left waiting on a broker that does not answer never holds its process's exit.

``pipeline ingress serve`` stopped while its broker was silent printed its last line, then did
not exit until a metrics refresh's metadata request, given up on long before, reached its
request timeout: the event loop's close waits for every thread of its default executor.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest
from faults.services import KafkaServer, kafka_libs

REQUEST_TIMEOUT_MS = 120_000
"""How long the abandoned request would wait: far past the subprocess's own bound."""

SCRIPT = """
import asyncio, sys
from pipeline.config import load_settings
from pipeline.transport import create_transport

async def main() -> None:
    transport = create_transport(load_settings(), "kafka")
    if sys.argv[1] == "lag":
        call = transport.admin().group_lag("a-group", "a-topic")
    else:
        call = transport.producer().send("a-topic", b"v", key=b"k")
    try:
        await asyncio.wait_for(call, 1.0)
    except TimeoutError:
        print("gave up", flush=True)

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def silent_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    """A broker of this module's own, paused (SIGSTOP): connections open, nothing answers."""
    libs = kafka_libs()
    if libs is None or shutil.which("java") is None:
        pytest.skip("the Kafka jars are not cached; run `make services` once")
    server = KafkaServer(tmp_path_factory.mktemp("kafka"), libs)
    server.start()
    server.pause()
    yield server
    server.resume()
    server.stop()


@pytest.mark.parametrize("call", ["lag", "produce"])
def test_a_call_given_up_on_does_not_hold_the_exit(silent_kafka: KafkaServer, call: str) -> None:
    """The process ends once its work is done, not when an abandoned request times out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env |= {
        "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": silent_kafka.bootstrap_servers,
        "PIPELINE_KAFKA__REQUEST_TIMEOUT_MS": str(REQUEST_TIMEOUT_MS),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, call],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,  # half the abandoned request's timeout: before the fix, it expired here
        check=False,
    )
    assert done.stdout == "gave up\n", done.stderr
    assert done.returncode == 0, done.stderr
