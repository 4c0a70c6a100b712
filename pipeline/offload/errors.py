"""What can go wrong with an offloaded payload, each error choosing what happens to the message.

::

    PipelineError
    ├── OffloadError            the payload store failed (retried: a store outage passes)
    └── HandlerOutcome
        ├── Retry
        │   └── ReferenceRefused   this member cannot resolve the reference (no store on the
        │                          lane, an unknown reference format): another member may
        ├── DeadLetter
        │   ├── PayloadMissing     the object is gone: dead letter ``payload_missing``
        │   └── PayloadCorrupt     the object's digest or size differs: ``payload_corrupt``

The two dead letters carry their reason in :attr:`dead_reason`, which the runtime's routing
writes as the dead letter's ``pl-dead-reason``.
"""

from __future__ import annotations

from pipeline.errors import DeadLetter, PipelineError, Retry


class OffloadError(PipelineError):
    """The payload store could not be reached or refused an operation."""


class ReferenceRefused(Retry):
    """This member cannot resolve a payload reference; it goes to a retry tier for another."""


class PayloadMissing(DeadLetter):
    """The referenced object does not exist (deleted, or never written to this store)."""

    dead_reason = "payload_missing"


class PayloadCorrupt(DeadLetter):
    """The referenced object's size or SHA-256 differs from the reference's."""

    dead_reason = "payload_corrupt"
