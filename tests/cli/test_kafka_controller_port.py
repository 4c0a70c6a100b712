"""A bootstrap address where a KRaft controller (or another service) listens is named as such.

``PIPELINE_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:9093`` (the controller's port in ``make
services``) answered "cannot reach Kafka ... Failed while waiting for controller ...; start it
(`make services`)" after 6.7 s: starting Kafka is the wrong advice when the port answers.
"""

from __future__ import annotations

import asyncio

import pytest
from support import kafka_topics_list

from pipeline.cli.kafka_listener import listener_kind, split_address

CONTROLLER = "127.0.0.1:9093"


async def test_the_controller_listener_is_named_not_a_kafka_to_start(kafka_service: str) -> None:
    """The controller's port: one line saying it is no broker's listener; no 'start it'."""
    host, port = split_address(CONTROLLER) or ("", 0)
    if await listener_kind(host, port, 2.0) != "controller":
        pytest.skip(f"no KRaft controller listens at {CONTROLLER} beside {kafka_service}")
    result = await asyncio.to_thread(kafka_topics_list, CONTROLLER)
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        f"error: cannot use Kafka at {CONTROLLER} (PIPELINE_KAFKA__BOOTSTRAP_SERVERS): something"
        " answers there that is not a Kafka broker's listener (a KRaft controller's, which"
        " serves no metadata; "
    ), line
    assert line.endswith(
        "check the listener: point PIPELINE_KAFKA__BOOTSTRAP_SERVERS at a broker's client"
        " listener (its advertised.listeners)"
    ), line
    assert "make services" not in line


async def test_the_broker_listener_is_a_broker(kafka_service: str) -> None:
    """The test broker's own bootstrap address answers as a broker."""
    host, port = split_address(kafka_service.split(",", maxsplit=1)[0]) or ("", 0)
    assert await listener_kind(host, port, 2.0) == "broker"


async def test_a_service_that_is_not_kafka_is_other() -> None:
    """A TCP server that answers with text (an HTTP server, say) is 'other'; a closed port None."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        assert await listener_kind("127.0.0.1", port, 2.0) == "other"
    finally:
        server.close()
        await server.wait_closed()
    assert await listener_kind("127.0.0.1", port, 2.0) is None  # closed: nothing answers


def test_bootstrap_entries_split_as_librdkafka_reads_them() -> None:
    """``host:port``, ``proto://host:port``, ``[v6]:port`` and a bare host (port 9092)."""
    assert split_address("127.0.0.1:9093") == ("127.0.0.1", 9093)
    assert split_address("PLAINTEXT://kafka:19092") == ("kafka", 19092)
    assert split_address("[::1]:9092") == ("::1", 9092)
    assert split_address("kafka") == ("kafka", 9092)
