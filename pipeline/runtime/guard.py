"""Around each handler run: per-key order across retries (parking) and poison detection.

Before a message of a lane with parking runs, :class:`RunGuard` asks Redis (``pl_begin``) what
to do with it: run it, divert it behind its key's parked head, drop a stale duplicate,
dead-letter it behind a dead-lettered head, or, when an earlier start of it never finished, run
it alone as a suspect (:mod:`pipeline.runtime.isolation`) unless its lone starts reached
``poison_after``. After the run it records how the message ended (``pl_end``). See
:mod:`pipeline.retry.parking` for the state and its guarantees.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from pipeline.envelope import Message
from pipeline.retry.parking import Ending, Parking
from pipeline.runtime.app import Lane
from pipeline.runtime.isolation import Isolation
from pipeline.runtime.routing import Routing
from pipeline.runtime.stats import Stats

log = logging.getLogger(__name__)

# How a handler outcome ends a parked message (anything else: done).
_ENDINGS: dict[str, Ending] = {"retried": "parked", "deferred": "parked", "dead_lettered": "dead"}

Run = Callable[[], Awaitable[str | None]]


class RunGuard:
    """Parking and poison detection around the runs of one member."""

    def __init__(
        self,
        parking: dict[str, Parking],
        routing: Routing,
        stats: Stats,
        isolation: Isolation,
    ) -> None:
        """Guard the lanes that have parking (Redis); others run unguarded."""
        self._parking = parking
        self._routing = routing
        self._stats = stats
        self._isolation = isolation

    async def run(self, lane: Lane, message: Message, run: Run) -> str | None:
        """Decide, run ``run()`` if it may, record the ending; returns the outcome."""
        parking = self._parking.get(lane.name)
        if parking is None:
            return await run()
        decision, starts = await parking.begin(message, ordered=_ordered(lane))
        if decision == "suspect":
            return await self._suspect(lane, message, run, parking, starts)
        if decision == "stale":
            self._stats.duplicates += 1
            return "duplicate"
        if decision == "divert":
            # Still parked behind its head: no end is recorded.
            return await self._routing.divert(lane, message, "parked")
        if decision == "sequenced":
            log.warning("dead-lettering %s@%d: sequenced", message.tp, message.offset)
            outcome = await self._routing.dead_letter(lane, message, decision, None)
            ending: Ending = "done"
        else:
            async with self._isolation.shared():
                outcome = await run()
            ending = _ending(lane, outcome)
        if outcome is not None:
            await parking.end(message, ending, follow_dead=_follow(lane))
        return outcome

    async def _suspect(
        self, lane: Lane, message: Message, run: Run, parking: Parking, starts: int
    ) -> str | None:
        """Run a message whose earlier start never finished alone, or dead-letter it as poison."""
        async with self._isolation.alone():
            poison, alone = await parking.solo(message, poison_after=lane.spec.retry.poison_after)
            if poison:
                log.warning(
                    "dead-lettering %s@%d: poison (started %d times, %d of them alone)",
                    message.tp,
                    message.offset,
                    starts,
                    alone,
                )
                outcome = await self._routing.dead_letter(lane, message, "poison", None)
                ending: Ending = "dead"
            else:
                outcome = await run()
                ending = _ending(lane, outcome)
        if outcome is not None:
            await parking.end(message, ending, follow_dead=_follow(lane))
        return outcome


def _ordered(lane: Lane) -> bool:
    return lane.spec.ordered and bool(lane.routes.retry_topics)


def _follow(lane: Lane) -> bool:
    return lane.spec.retry.after_dead_letter == "follow"


def _ending(lane: Lane, outcome: str | None) -> Ending:
    ending = _ENDINGS.get(outcome or "", "done")
    return "done" if ending == "parked" and not _ordered(lane) else ending
