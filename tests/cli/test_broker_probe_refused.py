"""The broker probe with nothing listening: the refusal said at once, not a 3 s timeout.

librdkafka retries a refused connection until the metadata request's timeout and then reports
``Failed while waiting for controller: Local: Timed out``: ``pipeline status`` and every command
that probes first waited 3 s to say a port held nothing. The probe now tries a TCP connection to
each bootstrap address first; only a refusal from every one settles it there.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from pipeline.cli.status_checks import reach_broker
from pipeline.config import Settings
from pipeline.errors import BrokerUnavailable

REFUSED = "connection refused at every bootstrap address"


def _kafka_at(settings: Settings, servers: str) -> Settings:
    kafka = settings.kafka.model_copy(update={"bootstrap_servers": servers})
    return settings.model_copy(update={"transport": "kafka", "kafka": kafka})


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


async def test_a_port_where_nothing_listens_is_said_to_refuse(settings: Settings) -> None:
    """Every address refusing: the line names the address, its variable and the refusal."""
    with pytest.raises(BrokerUnavailable) as down:
        await reach_broker(_kafka_at(settings, "127.0.0.1:1,PLAINTEXT://[::1]:1"))
    line = str(down.value)
    assert REFUSED in line
    assert "127.0.0.1:1" in line
    assert "PIPELINE_KAFKA__BOOTSTRAP_SERVERS" in line


async def test_one_address_answering_is_enough(settings: Settings) -> None:
    """A refused address beside the running broker: the probe asks the broker and passes."""
    await reach_broker(_kafka_at(settings, f"127.0.0.1:1,{settings.kafka.bootstrap_servers}"))


async def test_a_port_that_accepts_but_never_answers_is_left_to_the_metadata_request(
    settings: Settings, silent_port: int
) -> None:
    """Not a refusal: the metadata request decides (it times out), and the line says that."""
    with pytest.raises(BrokerUnavailable) as down:
        await reach_broker(_kafka_at(settings, f"127.0.0.1:{silent_port}"))
    assert REFUSED not in str(down.value)
    assert f"127.0.0.1:{silent_port}" in str(down.value)
