"""Apache Kafka transport on confluent-kafka (librdkafka)."""

from pipeline.transport.kafka.transport import KafkaTransport

__all__ = ["KafkaTransport"]
