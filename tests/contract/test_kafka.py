"""The contract suites against Kafka, a real broker."""

from __future__ import annotations

from contract.base.transport import TransportContract


class TestKafkaTransport(TransportContract):
    """KafkaTransport passes the transport contract."""

    kind = "kafka"
