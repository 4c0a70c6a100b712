"""Who is throttled, per lane: the admission stage's answer to ``pipeline status``.

A lane's first throttle key template names its tenants (``org:{tenant}``): the active keys with
that template's fixed prefix (``org:``) are the lane's tenants, and their waiters are how many
of their messages wait for a slot (the head of each waiting key; later messages of a key wait
in the member behind it). Read-only: nothing is acquired and no wake list is opened.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from redis.asyncio import Redis

from pipeline.admission.status import read_active_keys, read_status
from pipeline.topics.spec import TopicSpec


class ThrottledTenants:
    """Implements ``pipeline.observability.status.ThrottleView`` from the Redis throttle state."""

    def __init__(
        self,
        client: Redis,
        specs: Sequence[TopicSpec],
        *,
        prefix: str,
        namespace: str,
        default_limit: int,
    ) -> None:
        """Read the throttles of ``namespace`` for the lanes of ``specs``."""
        self._client = client
        self._prefix = prefix
        self._namespace = namespace
        self._default_limit = default_limit
        self._tenant_prefix = {
            spec.lane: spec.throttle.keys[0].split("{", 1)[0]
            for spec in specs
            if spec.throttle is not None
        }

    async def throttled_tenants(self, lane: str, limit: int) -> Sequence[tuple[str, int]]:
        """Up to ``limit`` (tenant, waiting) pairs of ``lane``, most waiting first."""
        prefix = self._tenant_prefix.get(lane)
        if not prefix:
            return []
        keys = [
            key
            for key in await read_active_keys(self._client, self._prefix, self._namespace)
            if key.startswith(prefix)
        ]
        states = await asyncio.gather(
            *(
                read_status(self._client, self._prefix, self._namespace, key, self._default_limit)
                for key in keys
            )
        )
        waiting = [(s.key[len(prefix) :], len(s.waiters)) for s in states if s.waiters]
        return sorted(waiting, key=lambda pair: (-pair[1], pair[0]))[:limit]
