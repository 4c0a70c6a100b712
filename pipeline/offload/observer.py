"""What the offload path reports, as a Protocol, so it never imports the metrics layer.

The stores' callers (the :class:`~pipeline.offload.writer.Offloader`, a member's payload
resolver, the purge) are handed an :class:`OffloadObserver`, or None to report nothing.
:class:`pipeline.observability.facades.OffloadMetrics` is the one that feeds Prometheus. Every
call names the store by its URL (``s3://bucket/prefix``, ``file:///...``): a bounded set, from
the topic declarations.
"""

from __future__ import annotations

from typing import Protocol


class OffloadObserver(Protocol):
    """Receives one call per object written, reused, fetched, missing or purged."""

    def written(self, store: str, size: int) -> None:
        """A payload of ``size`` bytes was written to ``store``: new, or a day old written again."""

    def reused(self, store: str) -> None:
        """A payload was already in ``store`` (same content): nothing was written."""

    def fetched(self, store: str, size: int, duration_s: float) -> None:
        """A payload of ``size`` bytes was read whole from ``store`` in ``duration_s``."""

    def missing(self, store: str) -> None:
        """A reference's object was not in ``store`` (its message is a payload_missing)."""

    def purged(self, store: str, objects: int) -> None:
        """A purge deleted ``objects`` objects from ``store``."""
