"""Whether a lane is backed up, so the sweeper can be patient with it ("late is not lost").

A produced row that nobody has processed yet is most likely queued behind a backlog, not lost;
replaying it then only adds work exactly when the consumers are behind. :class:`GroupLagBacklog`
reads the lag of the consumer group that consumes each lane (:meth:`Admin.group_lag`), over the
topics it is given: the sweeper gives a lane's main and retry-tier topics, since a copy waiting in
a retry tier is late too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from pipeline.errors import PipelineError
from pipeline.transport.protocol import Admin

log = logging.getLogger(__name__)


class Backlog(Protocol):
    """Tells whether a lane has a backlog."""

    async def is_backlogged(self, lane: str) -> bool:
        """True while the lane's consumers are behind (or when that cannot be known)."""
        ...


class GroupLagBacklog:
    """A lane is backed up when its group's lag, over the lane's topics, passes a threshold.

    A lane without a configured group, or whose lag cannot be read, counts as backed up: the
    sweeper then waits the maximum patience before replaying, the safe side for a lane it cannot
    see (no replay storm), while still bounding how long a lost event can wait.
    """

    def __init__(
        self,
        admin: Admin,
        lane_topics: Mapping[str, Sequence[str]],
        lane_groups: Mapping[str, str],
        threshold: int = 0,
    ) -> None:
        """Read lag with ``admin``; ``lane_groups`` names the consumer group of each lane."""
        self._admin = admin
        self._lane_topics = lane_topics
        self._lane_groups = lane_groups
        self._threshold = threshold
        self._warned: set[str] = set()

    async def is_backlogged(self, lane: str) -> bool:
        """Whether the group's lag over the lane's topics exceeds the threshold."""
        group = self._lane_groups.get(lane)
        if group is None:
            example = json.dumps({lane: "GROUP"})
            self._warn_once(
                lane,
                "no consumer group configured for it: add its group to"
                " PIPELINE_INGRESS__SWEEPER__LANE_GROUPS, a JSON object of lane to group"
                f" ('{example}', GROUP being the group that consumes it)",
            )
            return True
        lag = 0
        try:
            for topic in self._lane_topics.get(lane, ()):
                lag += sum(p.lag for p in await self._admin.group_lag(group, topic))
        except PipelineError as exc:
            log.warning("cannot read the lag of lane %s: %s", lane, exc)
            return True
        return lag > self._threshold

    def _warn_once(self, lane: str, why: str) -> None:
        if lane not in self._warned:
            self._warned.add(lane)
            log.warning("lane %s counts as backed up: %s", lane, why)
