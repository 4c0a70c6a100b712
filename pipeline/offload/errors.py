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

import re

from pipeline.errors import DeadLetter, PipelineError, Retry

METADATA_HOST = "169.254.169.254"
"""The instance metadata service, where the S3 client looks for credentials last."""

REFUSED_CREDENTIALS = (
    "the store refused the credentials: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    " (and AWS_SESSION_TOKEN for temporary ones), and that the key may use the bucket"
)
"""What a 403 from the store means and what to check (never the key itself)."""

_FORBIDDEN = "403 Forbidden"
_S3_CODE = re.compile(r"<Code>([^<]{1,100})</Code>")


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


def client_error_text(exc: BaseException) -> str:
    """A store client's error as one line: obstore's first line, without its debug dump.

    When the client fell back to the instance metadata service for credentials, the line says
    which variables to set (no ``AWS_ACCESS_KEY_ID`` was given); when the store answered 403
    (a wrong secret, an unknown key id, a key without access), it keeps the store's error code
    of its XML answer, not the answer, and says which variables to check.
    """
    lines = str(exc).strip().splitlines()
    text = lines[0].strip() if lines else type(exc).__name__
    if _FORBIDDEN in text and METADATA_HOST not in text:  # its XML answer follows: the code
        code = _S3_CODE.search(text)
        text = text.split(_FORBIDDEN, 1)[0] + _FORBIDDEN + (f" {code[1]}" if code else "")
        return f"{text} ({REFUSED_CREDENTIALS})"
    if METADATA_HOST in text:
        text += (
            " (no credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or run"
            " where the instance metadata service serves them)"
        )
    return text


def refused_credentials(text: str) -> bool:
    """Whether an :class:`OffloadError`'s text says the store refused the credentials (403)."""
    return REFUSED_CREDENTIALS in text
