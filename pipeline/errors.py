"""The pipeline's exception tree.

Every error the library raises on purpose is a :class:`PipelineError`; client-library errors
(confluent-kafka, redis-py, psycopg) are translated at the boundary with ``raise ... from exc`` so
callers never need to import a client library to handle a failure::

    PipelineError
    ├── ConfigError                 bad settings; names the setting and the expected form
    │   └── TracingUnavailable      OTEL_* asks for traces, the SDK is missing (pipeline/tracing)
    ├── TopicSpecError              a topics/*.yaml file is invalid; names the file and field
    ├── IngressError                a webhook was refused (pipeline/ingress/errors.py)
    │   ├── Rejected                verification failed: 401
    │   ├── Malformed               tenant / key / event id cannot be read: 400
    │   │   └── SchemaMismatch      the payload does not match its lane's schema: 400
    │   └── TooLarge                the body passed the source's cap: 413
    ├── LogStoreError               the durable log failed (pipeline/logstore/errors.py)
    ├── RegistryError               a schema registry request failed (pipeline/registry/errors.py,
    │   │                           each with its Confluent error code)
    │   ├── SubjectNotFound
    │   ├── VersionNotFound
    │   ├── SchemaNotFound
    │   ├── SubjectSoftDeleted
    │   ├── SubjectNotSoftDeleted
    │   ├── VersionSoftDeleted
    │   ├── VersionNotSoftDeleted
    │   ├── SubjectConfigNotFound
    │   ├── SubjectModeNotFound
    │   ├── IncompatibleSchema
    │   ├── InvalidSchema
    │   │   └── DefaultsTooCostly   its field defaults take too many steps to check (canonical.py)
    │   ├── InvalidVersion
    │   ├── InvalidSubject
    │   ├── InvalidCompatibility
    │   ├── InvalidMode
    │   ├── OperationNotPermitted
    │   │   └── SchemaIdTaken
    │   ├── IdConflict
    │   ├── StoreError
    │   ├── Unauthorized
    │   ├── Forbidden
    │   └── SerdeError
    │       └── RegistryUnreachable the registry did not answer (client side)
    ├── TransportError              a broker operation failed
    │   ├── BrokerUnavailable       the broker (Kafka or Redis) cannot be reached
    │   │   └── BrokerRefused       it answered but refused the login or TLS (cli/status_checks)
    │   ├── UnknownTopic            the topic is not declared / does not exist on the broker
    │   ├── MessageTooLarge         the message exceeds the configured maximum size
    │   ├── DeliveryFailed          the broker refused or lost a produced message
    │   ├── GroupNotEmpty           a consumer group to delete still has members
    │   └── UnreadableTopicMeta     a Redis topic's entry in the topics hash cannot be read
    ├── DebounceUnavailable         the debouncer's Redis cannot be reached: the message is
    │                               processed on its own (fail open)
    ├── ThrottleClosed              the throttle closed while a message waited for its slots
    ├── HandlerTimeout              a CPU-bound handler ran past its limit (pipeline/runtime/cpu.py)
    ├── WorkerCrashed               a CPU-bound handler's worker process died (retryable)
    ├── HandlerHung                 a handler fell silent past its heartbeat timeout (retryable)
    ├── HandlerCancelled            a handler raised CancelledError though nothing stopped it
    │                               (retryable; pipeline/runtime/handling.py)
    ├── CancelFailed                Redis could not record a cancellation (pipeline/cancel)
    ├── OffloadError                the payload store failed or refused (pipeline/offload)
    ├── LaneTaken                   another group took a lane this member consumes (lane lease)
    └── HandlerOutcome              raised by a handler to choose what happens to its message
        ├── Retry                   try again later, through the lane's next retry tier
        │   ├── Throttled           a dependency refused for now (429): retry, and slow its key
        │   └── ReferenceRefused    (offload) this member cannot resolve a payload reference
        ├── DeadLetter              never retry: straight to the lane's dead-letter topic
        │   ├── Expired             (the runtime's) past its deadline, or shed by a standing queue
        │   ├── PoisonMessage       (the runtime's) its runs kept being interrupted: poison
        │   ├── SequencedDeadLetter (the runtime's) it follows a dead-lettered head of its key
        │   ├── PayloadMissing      (offload) the referenced payload does not exist
        │   └── PayloadCorrupt      (offload) the payload's size or SHA-256 does not match
        └── Skip                    done without doing anything (counted, not an error)

A test (``tests/test_errors.py``) holds this drawing equal to the real subclasses.

Whether any other exception a handler raises is retried is decided by one function,
:func:`pipeline.retry.policy.default_retryable` (or the one given to the :class:`App`).
"""

from __future__ import annotations

from collections.abc import Callable


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

    diagnose: Callable[[], str | None] | None = None
    """Asks the broker, briefly, why it did not answer, for a command's line (a refused login);
    set by the transport that knows how, None when there is nothing more to ask."""


class UnknownTopic(TransportError):
    """The topic does not exist on the broker (run ``pipeline topics apply``)."""


class MessageTooLarge(TransportError):
    """The message is larger than the configured maximum message size."""


class DeliveryFailed(TransportError):
    """The broker did not acknowledge a produced message."""


class GroupNotEmpty(TransportError):
    """A consumer group cannot be deleted while it has members."""


class DebounceUnavailable(PipelineError):
    """The debouncer's Redis cannot be reached; process the message on its own (fail open)."""


class ThrottleClosed(PipelineError):
    """The throttle was closed while a message waited for its slots; the wait is withdrawn."""


class HandlerOutcome(PipelineError):
    """Raised by a handler to choose what happens to its message."""


class Retry(HandlerOutcome):
    """Try the message again later, through the lane's next retry tier."""


class Throttled(Retry):
    """A downstream dependency refused the call for now (an HTTP 429, a quota error).

    The message goes through the next retry tier like any :class:`Retry`; on a lane whose
    throttle makes the dependency's key adaptive, its fleet-wide limit shrinks, and with
    ``retry_after_s`` (the ``Retry-After`` the dependency sent) no new job takes that key
    before then. ``dependency`` names the key (``vision-api`` or ``dep:vision-api``) when the
    job holds several adaptive keys.
    """

    def __init__(
        self,
        message: str = "",
        *,
        retry_after_s: float | None = None,
        dependency: str | None = None,
    ) -> None:
        """Record the dependency's Retry-After and which dependency it was."""
        super().__init__(message or f"throttled by {dependency or 'a dependency'}")
        self.retry_after_s = retry_after_s
        self.dependency = dependency


class DeadLetter(HandlerOutcome):
    """Do not retry: send the message to the lane's dead-letter topic with this reason."""


class Expired(DeadLetter):
    """Recorded on a dead letter the runtime sent because its deadline passed or it was shed."""


class PoisonMessage(DeadLetter):
    """Recorded on a dead letter the runtime sent as poison: its runs kept being interrupted."""

    dead_reason = "poison"


class SequencedDeadLetter(DeadLetter):
    """Recorded on a dead letter that followed a dead-lettered message of its key (in order)."""


class Skip(HandlerOutcome):
    """The message needs no work; it counts as done."""
