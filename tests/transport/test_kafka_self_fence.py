"""A static member fenced by its own rejoin after a session timeout rejoins; a name clash stops it.

librdkafka reports both as "Static consumer fenced by other consumer with same
group.instance.id" (confluentinc/librdkafka#3437); only the self-inflicted one follows the
consumer's own ``SESSTMOUT`` log line. The lines and the error are librdkafka's own, as its log
callback and ``KafkaError`` deliver them; no broker is involved (the consumer joins on its first
poll, which these tests never make).
"""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import KafkaError

from pipeline.config import KafkaSettings
from pipeline.errors import ConfigError
from pipeline.transport.kafka.consumer import KafkaConsumer

FENCED = KafkaError(
    KafkaError.FENCED_INSTANCE_ID,
    "Fatal consumer error: Broker: Static consumer fenced by other consumer with same"
    " group.instance.id",
    fatal=True,
)
SESSION_LINE = (
    "[thrd:main]: Consumer group session timed out (in join-state steady) after 3017 ms without a"
    " successful response from the group coordinator (broker 1, last error was Success):"
    " revoking assignment and rejoining group"
)


def member() -> KafkaConsumer:
    """A static member that has not joined yet."""
    return KafkaConsumer(KafkaSettings(), "g", ["t"], instance="vm-1")


def librdkafka_logs(consumer: KafkaConsumer, facility: str, text: str) -> None:
    """What librdkafka's log callback passes for one line of this consumer."""
    session_log = consumer._session_log  # the logger librdkafka is given
    session_log.log(logging.WARNING, "%s [%s] %s", facility, "pipeline-vm-1#consumer-1", text)


def test_a_fence_right_after_its_own_session_timed_out_rejoins() -> None:
    """The fence that follows the consumer's own session timeout schedules a new client."""
    consumer = member()
    librdkafka_logs(consumer, "SESSTMOUT", SESSION_LINE)
    before = time.monotonic()
    consumer._on_fatal(FENCED)  # as the consumer thread does
    assert consumer._rejoin_at > before


def test_a_fence_without_a_session_timeout_is_a_name_clash() -> None:
    """Another live member with the same name stops this one, with one line saying so."""
    consumer = member()
    librdkafka_logs(consumer, "HEARTBEAT", "[thrd:main]: Group heartbeat error response")
    with pytest.raises(ConfigError, match="another live member uses the same --instance name"):
        consumer._on_fatal(FENCED)


def test_only_one_fence_per_session_timeout_is_forgiven() -> None:
    """After its rejoin, a second fence with no new session timeout is a name clash."""
    consumer = member()
    librdkafka_logs(consumer, "SESSTMOUT", SESSION_LINE)
    consumer._on_fatal(FENCED)
    with pytest.raises(ConfigError, match="was fenced"):
        consumer._on_fatal(FENCED)


def test_every_line_still_reaches_the_log(caplog: pytest.LogCaptureFixture) -> None:
    """The consumer's logger passes librdkafka's lines on unchanged."""
    consumer = member()
    with caplog.at_level(logging.WARNING, logger="pipeline.librdkafka"):
        librdkafka_logs(consumer, "SESSTMOUT", SESSION_LINE)
    assert caplog.messages == [f"SESSTMOUT [pipeline-vm-1#consumer-1] {SESSION_LINE}"]
