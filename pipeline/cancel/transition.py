"""The one transition to cancelled, whoever pulls the trigger.

``pipeline cancel``, ``await app.cancel(...)``, the reconciler (:mod:`pipeline.cancel.reconcile`)
and deadlines all end in the same Lua function (``transition`` in ``lua/cancel.lua``), so
"cancelled" has one meaning: the covered work does not run any more. Queued, parked and
retry-tier messages are skipped with outcome ``cancelled`` when they come up; running handlers
are stopped (asyncio cancellation and ``ctx.cancelled``; SIGTERM, then SIGKILL after
``runtime.cancel_grace_s``, for ``cpu=True`` handlers) within ``runtime.cancel_poll_ms``.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline.cancel.functions import CancelFunctions
from pipeline.cancel.target import Target
from pipeline.errors import PipelineError
from pipeline.redis_functions import LONGEST_EXPIRY_MS
from pipeline.retry.guard_store import copy_lifetime_ms
from pipeline.topics.spec import DLQ_MIN_RETENTION_MS, TopicSpec

log = logging.getLogger(__name__)

MAX_KEEP_MS = LONGEST_EXPIRY_MS
"""The longest a cancellation is kept (a lane may retain its messages for ever)."""
KEEP_MS = DLQ_MIN_RETENTION_MS + 86_400_000
"""How long a cancellation is kept when the lanes it covers are not known (15 days): the least a
dead-letter topic keeps a message, two weeks, and a day for the retry path before it."""


def keep_ms_of(specs: Iterable[TopicSpec], lane: str | None = None) -> int:
    """How long a cancellation of ``lane``'s work (every lane's if None) is kept.

    As long as the work it covers can come back
    (:func:`~pipeline.retry.guard_store.copy_lifetime_ms` of each covered lane, the bound
    ``ctx.once`` keeps its records by), so a dead letter redriven on its topic's last day stays
    cancelled. At most
    :data:`MAX_KEEP_MS`; :data:`KEEP_MS` when no lane is covered.
    """
    kept = [copy_lifetime_ms(spec) for spec in specs if lane is None or spec.lane == lane]
    return min(max(kept, default=KEEP_MS), MAX_KEEP_MS)


class CancelFailed(PipelineError):
    """Redis could not record a cancellation (nothing was cancelled)."""


_BOUND: weakref.WeakKeyDictionary[Redis, dict[str, CancelFunctions]] = weakref.WeakKeyDictionary()
"""The library bound to each client and prefix, so that it is loaded once per client (a new
binding per call sent ``FUNCTION LOAD REPLACE`` with every cancellation)."""


def _functions(redis: Redis, prefix: str) -> CancelFunctions:
    """The library's binding to ``redis`` under ``prefix``, made on first use."""
    bound = _BOUND.setdefault(redis, {})
    functions = bound.get(prefix)
    if functions is None:
        functions = bound[prefix] = CancelFunctions(redis, prefix)
    return functions


async def cancel(
    redis: Redis,
    prefix: str,
    target: Target,
    reason: str = "cancelled",
    *,
    keep_ms: int | None = None,
    specs: Iterable[TopicSpec] = (),
    now_ms: int | None = None,
) -> int:
    """Cancel the work ``target`` covers, for ``reason``; returns running long work told to stop.

    Idempotent: cancelling again refreshes the cancellation's time, so it also covers work
    that appeared since. That time is the Redis server's clock (``now_ms`` overrides it), the
    clock Redis Streams stamps messages with, so the canceller's own clock does not matter.
    It stands ``keep_ms`` from then (at most :data:`MAX_KEEP_MS`), by default as long as the
    lanes of ``specs`` it covers can bring their work back (:func:`keep_ms_of`; ``pipeline
    cancel`` gives the topics directory's, ``App.cancel`` its app's).

    Raises:
        CancelFailed: Redis did not answer or refused the call.
        ValueError: ``keep_ms`` is not positive.
    """
    if keep_ms is None:
        keep_ms = keep_ms_of(specs, target.lane)
    if keep_ms <= 0:
        raise ValueError(f"keep_ms must be positive, got {keep_ms}")
    try:
        functions = _functions(redis, prefix)
        _, stopped = await functions.cancel(
            target.kind,
            target.lane or "*",
            target.value,
            reason,
            now_ms or 0,
            min(keep_ms, MAX_KEEP_MS),
        )
    except (rexc.RedisError, OSError) as exc:
        raise CancelFailed(f"could not cancel {target} in Redis: {exc}") from exc
    log.info("cancelled %s (%s); %d running told to stop", target, reason, stopped)
    return int(stopped)
