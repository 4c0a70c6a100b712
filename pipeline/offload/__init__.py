"""Large payloads by reference: the body goes to a store, a small reference rides the broker.

ingress / producer -> :class:`~pipeline.offload.writer.Offloader` (content-addressed write,
durable before the 2xx) -> broker (the reference: :mod:`pipeline.offload.reference`) ->
runtime (:mod:`pipeline.runtime.payloads`: a :class:`~pipeline.offload.lazy.LazyPayload`, or
the decoded event) -> the purge (:mod:`pipeline.offload.purge`) once nothing can need it.
Stores: :mod:`pipeline.offload.s3` and :mod:`pipeline.offload.directory` behind
:class:`~pipeline.offload.store.PayloadStore`. ``docs/offload.md`` has the whole story.
"""

from __future__ import annotations

from pipeline.offload.errors import OffloadError, PayloadCorrupt, PayloadMissing, ReferenceRefused
from pipeline.offload.lazy import LazyPayload, read_body
from pipeline.offload.policy import OffloadPolicy

__all__ = [
    "LazyPayload",
    "OffloadError",
    "OffloadPolicy",
    "PayloadCorrupt",
    "PayloadMissing",
    "ReferenceRefused",
    "read_body",
]
