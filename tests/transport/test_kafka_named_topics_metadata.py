"""Named topics read from their metadata: what a caller gets for each answer the broker gives.

``KafkaAdmin.list_topics(names)`` reads each named topic's own metadata. A topic that does not
exist is left out; a broker down is one ``BrokerUnavailable`` within one request timeout; a
topic the broker refuses to describe (no Describe ACL) fails the call with one line that names
that topic. The local broker runs without an authorizer, so that answer is the one thing here
given by a stand-in of the admin client's metadata call; the rest is the real broker.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError
from contract.helpers import make_topic

from pipeline.config import KafkaSettings, Settings
from pipeline.errors import BrokerUnavailable, TransportError
from pipeline.testing.ports import free_port
from pipeline.transport import create_transport
from pipeline.transport.kafka.admin import KafkaAdmin


class _Refusing:
    """The admin client, but ``refused``'s metadata comes back with an authorisation error."""

    def __init__(self, raw: Any, refused: str) -> None:
        self._raw = raw
        self._refused = refused

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        """The broker's answer, or for ``refused`` the one an ACL without Describe gives."""
        if topic != self._refused:
            return self._raw.list_topics(topic, timeout=timeout)
        error = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
        return SimpleNamespace(topics={topic: SimpleNamespace(error=error, partitions={})})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


async def test_a_topic_refused_to_this_client_is_named_in_the_error(
    settings: Settings, kafka_service: str, unique: str
) -> None:
    """Which topic the broker refused is in the one line, beside the broker's reason."""
    transport = create_transport(settings, "kafka")
    shown, refused = f"meta_ok_{unique}", f"meta_refused_{unique}"
    try:
        await make_topic(transport, shown, 1)
        admin = KafkaAdmin(settings.kafka)
        admin._raw = _Refusing(admin._raw, refused)  # the broker's authorisation answer
        with pytest.raises(TransportError) as raised:
            await admin.list_topics([shown, refused])
        assert refused in str(raised.value)
        assert "Topic authorization failed" in str(raised.value)
        assert await admin.list_topics([shown]) == await transport.admin().list_topics([shown])
    finally:
        await transport.close()


async def test_named_topics_of_a_broker_down_fail_once_within_one_timeout() -> None:
    """Nothing listens: one BrokerUnavailable for all the names, after one request timeout."""
    admin = KafkaAdmin(
        KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_ms=2000)
    )
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match="list topics"):
        await admin.list_topics(["a", "b", "c", "d"])
    assert time.monotonic() - started < 4 * 2.0  # not one timeout per name


async def test_named_topics_that_do_not_exist_are_left_out(
    settings: Settings, kafka_service: str, unique: str
) -> None:
    """Missing names are not listed, and the ones that exist are, with their partitions."""
    transport = create_transport(settings, "kafka")
    name = f"meta_here_{unique}"
    try:
        await make_topic(transport, name, 3)
        listed = await transport.admin().list_topics([name, f"meta_missing_{unique}"])
        assert {n: i.partitions for n, i in listed.items()} == {name: 3}
    finally:
        await transport.close()
