"""The pipeline's exception tree.

Every error the library raises on purpose is a :class:`PipelineError`; client-library errors
(confluent-kafka, redis-py, psycopg) are translated at the boundary with ``raise ... from exc`` so
callers never need to import a client library to handle a failure::

    PipelineError
    ├── ConfigError                 bad settings; names the setting and the expected form
    ├── TopicSpecError              a topics/*.yaml file is invalid; names the file and field
    └── TransportError              a broker operation failed
        ├── BrokerUnavailable       the broker (Kafka or Redis) cannot be reached
        ├── UnknownTopic            the topic is not declared / does not exist on the broker
        ├── MessageTooLarge         the message exceeds the configured maximum size
        └── DeliveryFailed          the broker refused or lost a produced message
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base class of every error the pipeline raises on purpose."""


class ConfigError(PipelineError):
    """Configuration is invalid; the message names the setting and the expected form."""


class TopicSpecError(PipelineError):
    """A topic declaration is invalid; the message names the file and the field."""


class TransportError(PipelineError):
    """A broker operation failed."""


class BrokerUnavailable(TransportError):
    """The broker cannot be reached (connection refused, timed out, all brokers down)."""


class UnknownTopic(TransportError):
    """The topic does not exist on the broker (run ``pipeline topics apply``)."""


class MessageTooLarge(TransportError):
    """The message is larger than the configured maximum message size."""


class DeliveryFailed(TransportError):
    """The broker did not acknowledge a produced message."""
