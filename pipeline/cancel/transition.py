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

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline.cancel.functions import CancelFunctions
from pipeline.cancel.target import Target
from pipeline.errors import PipelineError

log = logging.getLogger(__name__)

KEEP_MS = 7 * 24 * 3_600_000
"""How long a standing cancellation is kept: longer than any message stays in a retry tier."""


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
    keep_ms: int = KEEP_MS,
    now_ms: int | None = None,
) -> int:
    """Cancel the work ``target`` covers, for ``reason``; returns running long work told to stop.

    Idempotent: cancelling again refreshes the cancellation's time, so it also covers work
    that appeared since. That time is the Redis server's clock (``now_ms`` overrides it), the
    clock Redis Streams stamps messages with, so the canceller's own clock does not matter.

    Raises:
        CancelFailed: Redis did not answer or refused the call.
    """
    try:
        functions = _functions(redis, prefix)
        _, stopped = await functions.cancel(
            target.kind, target.lane or "*", target.value, reason, now_ms or 0, keep_ms
        )
    except (rexc.RedisError, OSError) as exc:
        raise CancelFailed(f"could not cancel {target} in Redis: {exc}") from exc
    log.info("cancelled %s (%s); %d running told to stop", target, reason, stopped)
    return int(stopped)
