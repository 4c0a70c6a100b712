"""Each process's Kafka producer names itself: librdkafka's lines and the broker tell them apart.

librdkafka names a client ``<client.id>#producer-<N>``, N counting the clients of one process:
producers of several processes (``pipeline ingress serve --workers N``) with one ``client.id``
all log as ``pipeline#producer-1``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from contract.helpers import make_topic

from pipeline.config import Settings
from pipeline.transport.kafka.producer import producer_config
from pipeline.transport.kafka.transport import KafkaTransport

pytestmark = pytest.mark.usefixtures("kafka_service")
PRODUCER = Path(__file__).with_name("producer_name_proc.py")
PROCESSES = 2


async def _names_heard(topic: str) -> dict[int, list[str]]:
    """Run one producer process at a time; each one's id and the client names it logged."""
    heard: dict[int, list[str]] = {}
    for _ in range(PROCESSES):
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(PRODUCER), topic, stdout=subprocess.PIPE
        )
        try:
            out, _ = await asyncio.wait_for(child.communicate(), 60)
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
        assert child.returncode == 0
        report = json.loads(out.decode().strip().splitlines()[-1])
        heard[report["pid"]] = report["names"]
    return heard


async def test_producers_of_two_processes_log_under_names_of_their_own(
    settings: Settings, unique: str
) -> None:
    """Each process's lines carry its own name, starting with the configured ``client_id``."""
    topic = f"names_{unique}"
    await make_topic(KafkaTransport(settings), topic, 1)
    heard = await _names_heard(topic)
    assert len(heard) == PROCESSES
    for pid, names in heard.items():
        assert names == [f"{settings.kafka.client_id}-producer-{pid}#producer-1"], heard
    client_ids = {name.partition("#")[0] for names in heard.values() for name in names}
    assert len(client_ids) == PROCESSES


def test_a_client_id_given_in_the_client_properties_is_kept(settings: Settings) -> None:
    """``PIPELINE_KAFKA__CLIENT={"client.id": ...}`` names the producer as it says."""
    config = producer_config(settings.kafka, 1_000_000)
    assert config["client.id"] == f"{settings.kafka.client_id}-producer-{os.getpid()}"
    chosen = settings.kafka.model_copy(update={"client": {"client.id": "mine"}})
    assert producer_config(chosen, 1_000_000)["client.id"] == "mine"
