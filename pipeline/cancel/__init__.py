"""Cancellation of work and the heartbeats of long work.

* :mod:`~pipeline.cancel.target`: what a cancellation covers (event, key, tenant, lane).
* :mod:`~pipeline.cancel.transition`: :func:`cancel`, the one transition to cancelled.
* :mod:`~pipeline.cancel.reconcile`: the reconciler that stops hung and abandoned work.
* ``lua/cancel.lua`` and :mod:`~pipeline.cancel.functions`: the state in Redis.

The runtime applies cancellations in its chain (:mod:`pipeline.runtime.longwork`).
"""

from __future__ import annotations

from pipeline.cancel.target import Target
from pipeline.cancel.transition import CancelFailed, cancel

__all__ = ["CancelFailed", "Target", "cancel"]
