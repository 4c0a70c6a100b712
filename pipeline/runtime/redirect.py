"""Where a member sends what its handlers did not finish: retry tiers, the DLQ, a deferral.

:class:`Redirector` decides the destination of a failure (one explicit retriability function,
the lane's attempt limit and retry budget) and produces it through the
:class:`~pipeline.retry.router.RetryRouter`, retrying while the broker is unavailable, counting
every outcome in :class:`~pipeline.runtime.stats.Stats` and the member's metrics. Where a
failure went, and why (:class:`Routed`), is what the failure log says
(:mod:`~pipeline.runtime.failure_log`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from pipeline import headers as h
from pipeline import tracing
from pipeline.envelope import Delivered, Message
from pipeline.errors import TransportError
from pipeline.log_repeats import error_text
from pipeline.observability.facades import RuntimeMetrics
from pipeline.offload.errors import OffloadError
from pipeline.retry.budget import RetryBudget
from pipeline.retry.policy import Retryable, default_retryable
from pipeline.retry.router import LaneRoutes, RetryRouter
from pipeline.runtime.app import Lane
from pipeline.runtime.stats import Stats

log = logging.getLogger(__name__)
_ROUTE_RETRY_S = (0.1, 0.5, 1.0, 2.0, 5.0)
OnRoute = Callable[[Lane, Message, int], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Routed:
    """Where a handler's failure went, as :meth:`Redirector.routed` decided and sent it."""

    outcome: str | None
    """``retried``, ``dead_lettered``; None: it could not be produced (left for redelivery)."""
    detail: str
    """The retry tier's topic, or the dead letter's reason (``fatal``, ``exhausted``, ...)."""


class Redirector:
    """Sends failed, deferred and diverted messages on; None means it could not."""

    def __init__(
        self,
        router: RetryRouter,
        stats: Stats,
        retryable: Retryable,
        lanes: Sequence[Lane],
        metrics: RuntimeMetrics | None = None,
    ) -> None:
        """Route through ``router``; lanes with a ``retry.budget`` get a budget each."""
        self._router = router
        self._stats = stats
        self._retryable = retryable
        self._metrics = metrics
        self._budgets = {
            lane.name: RetryBudget(lane.spec.retry.budget)
            for lane in lanes
            if lane.spec.retry.budget
        }
        self.stopping = False
        """Set on shutdown: give up on an unavailable broker at once (redelivery covers it)."""
        self.on_route: OnRoute | None = None
        """Awaited before a message is produced to a retry tier, with the copy's attempt (the
        guard parks its key there first)."""

    def processed(self, lane: Lane) -> None:
        """A message of ``lane`` reached its handler: it earns the lane retry budget."""
        budget = self._budgets.get(lane.name)
        if budget is not None:
            budget.processed()

    async def failure(
        self, lane: Lane, message: Message, attempt: int, error: Exception
    ) -> str | None:
        """Route a handler failure to a retry tier or the DLQ: :meth:`routed`'s outcome."""
        return (await self.routed(lane, message, attempt, error)).outcome

    async def routed(self, lane: Lane, message: Message, attempt: int, error: Exception) -> Routed:
        """Route a handler failure to a retry tier or the DLQ; where it went, and why.

        A fatal error, or one out of attempts, goes to the DLQ; a retryable one to the next
        tier, or to the longest tier once the lane's retry budget is spent.
        """
        routes = lane.routes
        if not self.retryable(
            lane, error, f"{message.topic}[{message.partition}]@{message.offset}"
        ):
            reason = getattr(error, "dead_reason", "fatal")  # payload_missing, payload_corrupt
            return Routed(await self.dead_letter(lane, message, reason, error), reason)
        if attempt >= routes.max_attempts or not routes.retry_topics:
            return Routed(await self.dead_letter(lane, message, "exhausted", error), "exhausted")
        budget = self._budgets.get(lane.name)
        longest = budget is not None and not budget.try_spend()
        if longest:
            self._stats.budget_exhausted += 1
        last = len(routes.retry_topics)
        tier = last if longest else min(attempt, last)
        label = routes.retry_topics[tier - 1].rsplit(".", 1)[-1]  # the delay, as in the name
        if self.on_route is not None:
            await self.on_route(lane, message, attempt + 1)
        sent = await self._send(
            lane,
            message,
            "retried",
            lambda r, m: self._router.retry(r, m, attempt, error, longest=longest),
            label,
        )
        return Routed(sent, routes.retry_topics[tier - 1])

    def retryable(self, lane: Lane, error: BaseException, where: str) -> bool:
        """Whether ``error`` (of ``where`` on ``lane``) is retried, by the app's function.

        A function that raises is a bug of the app's: the failure is routed by
        :func:`~pipeline.retry.policy.default_retryable` instead, with one error line, so the
        message is neither lost nor left unfinished.
        """
        try:
            return self._retryable(error)
        except Exception as exc:
            log.error(  # noqa: TRY400 - the line says it all; the app's function is at fault
                "lane %s: %s: the app's retryable function raised %s: %s on %s: %s;"
                " routed by the default rule instead (fix the function)",
                lane.name,
                where,
                type(exc).__name__,
                error_text(exc),  # the app's exceptions: a __str__ that raises too
                type(error).__name__,
                error_text(error),
            )
            return default_retryable(error)

    async def dead_letter(
        self,
        lane: Lane,
        message: Message,
        reason: str,
        error: BaseException | None,
        *,
        attempt: int | None = None,
    ) -> str | None:
        """Send ``message`` to the lane's DLQ with ``reason``.

        Its ``pl-attempt`` says ``attempt`` (a debounced turn's count), by default the attempt
        the member counts the message as (:func:`~pipeline.headers.attempt`: 1 on a main topic,
        whatever ``pl-attempt`` a producer wrote there).
        """
        tracing.event(reason)  # poison, expired, shed, fatal, exhausted, sequenced
        counted = h.attempt(message.topic, message.headers) if attempt is None else attempt
        return await self._send(
            lane,
            message,
            "dead_lettered",
            lambda r, m: self._router.dead_letter(r, m, reason, error, attempt=counted),
            reason,
            error,
        )

    async def divert(self, lane: Lane, message: Message, outcome: str) -> str | None:
        """Send ``message`` through the first tier, not as a failure (parked or deferred)."""
        tracing.event("diverted", outcome)
        if self.on_route is not None:
            await self.on_route(lane, message, h.attempt(message.topic, message.headers))
        return await self._send(lane, message, outcome, self._router.divert)

    async def _send(
        self,
        lane: Lane,
        message: Message,
        outcome: str,
        send: Callable[[LaneRoutes, Message], Awaitable[Delivered]],
        detail: str = "",
        error: BaseException | None = None,
    ) -> str | None:
        """Produce a routed message, retrying while the broker or payload store is unavailable.

        Returns ``outcome``, or None if it could not be produced (the message is then left
        unfinished, so it is redelivered rather than lost). The payload store is asked when
        the message is an offloaded reference whose object must be written again first
        (:meth:`~pipeline.offload.writer.Offloader.keep`).
        """
        for pause_s in (*_ROUTE_RETRY_S, None):
            try:
                await send(lane.routes, message)
            except (TransportError, OffloadError) as exc:
                if pause_s is None or self.stopping:
                    log.error(  # noqa: TRY400 - the broker error is the whole story
                        "could not route %s@%d: %s", message.tp, message.offset, exc
                    )
                    return None
                await asyncio.sleep(pause_s)  # back off while the broker is unavailable
            else:
                self._count(lane, outcome, detail, error)
                return outcome
        return None

    def _count(
        self, lane: Lane, outcome: str, detail: str, error: BaseException | None = None
    ) -> None:
        if outcome == "retried":
            self._stats.retried += 1
            if self._metrics is not None:
                self._metrics.retried(lane.name, detail)
        elif outcome == "dead_lettered":
            self._stats.dead_lettered += 1
            if self._metrics is not None:
                self._metrics.dead_lettered(lane.name, detail, error)
        elif outcome == "deferred":
            self._stats.deferred += 1
        else:
            self._stats.parked += 1
