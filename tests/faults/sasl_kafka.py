"""A private Kafka broker whose one client listener is SASL_PLAINTEXT with PLAIN users.

Shared by the tests of a refused SASL login (the commands' one line, the ingress's start): the
user ``app`` has the password ``app-pw``; :data:`WRONG` is a password it refuses.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from faults.services import KafkaServer, kafka_libs

__all__ = ["WRONG", "SaslKafka", "sasl_client", "sasl_kafka"]

WRONG = "wrong-password-5b2e"
_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required"
    ' username="admin" password="admin-pw" user_admin="admin-pw" user_app="app-pw";'
)


class SaslKafka(KafkaServer):
    """A private broker whose one client listener is SASL_PLAINTEXT with PLAIN users."""

    def _configure(self) -> Path:
        properties = super()._configure()
        text = properties.read_text(encoding="utf-8")
        lines = [
            line.replace("PLAINTEXT://", "SASL_PLAINTEXT://", 1)
            if line.startswith(("listeners=", "advertised.listeners="))
            else line
            for line in text.splitlines()
        ]
        text = "\n".join(lines).replace(
            "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        )
        text = text.replace(
            "inter.broker.listener.name=PLAINTEXT", "inter.broker.listener.name=SASL_PLAINTEXT"
        )
        text += (
            "\nsasl.enabled.mechanisms=PLAIN\nsasl.mechanism.inter.broker.protocol=PLAIN\n"
            f"listener.name.sasl_plaintext.plain.sasl.jaas.config={_JAAS}\n"
        )
        properties.write_text(text, encoding="utf-8")
        return properties


@contextmanager
def sasl_kafka(directory: Path) -> Iterator[str]:
    """The bootstrap address of a private SASL broker in ``directory``, stopped at the end.

    Skips the test when the Kafka jars are not cached.
    """
    libs = kafka_libs()
    if libs is None:
        pytest.skip("no cached Kafka jars (run deploy/local/kafka.sh once)")
    server = SaslKafka(directory, libs)
    server.start()
    try:
        yield server.bootstrap_servers
    finally:
        server.stop()


def sasl_client(password: str) -> dict[str, str]:
    """The PIPELINE_KAFKA__CLIENT properties of user ``app`` logging in with ``password``."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "app",
        "sasl.password": password,
    }
