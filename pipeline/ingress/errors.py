"""The ingress's errors, a branch of the pipeline's tree (see :mod:`pipeline.errors`).

::

    PipelineError
    └── IngressError                 a webhook request cannot be accepted
        ├── Rejected                 verification failed: 401, counted, nothing stored
        ├── Malformed                verified, but tenant / key / event id cannot be read: 400
        │   └── SchemaMismatch       the payload does not match its lane's schema: 400
        └── TooLarge                 the body passed the source's cap: 413, nothing stored

Configuration problems (an undeclared topic, a missing secret) are
:class:`~pipeline.errors.ConfigError` and stop the ingress at start.
"""

from __future__ import annotations

from pipeline.errors import PipelineError


class IngressError(PipelineError):
    """A webhook request cannot be accepted."""

    def __init__(self, reason: str) -> None:
        """Keep ``reason``: a short, fixed phrase safe to count and to send back."""
        super().__init__(reason)
        self.reason = reason


class Rejected(IngressError):
    """The request failed verification (bad, missing or stale signature)."""


class Malformed(IngressError):
    """The verified body or headers do not yield what the source needs (JSON, ids)."""


class SchemaMismatch(Malformed):
    """The payload does not match its lane's registered schema; ``detail`` names the field."""

    def __init__(self, detail: str) -> None:
        """Count as ``schema mismatch``; answer with ``detail`` too."""
        super().__init__("schema mismatch")
        self.detail = detail


class TooLarge(IngressError):
    """The body passed the source's cap (answered 413)."""

    def __init__(self, reason: str = "body too large") -> None:
        """Count as ``body too large``."""
        super().__init__(reason)
