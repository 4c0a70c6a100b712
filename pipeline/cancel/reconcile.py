"""The reconciler: stops long work no one waits for any more, or that fell silent.

Per lane with a ``heartbeat_timeout``, it looks at the registered runs (``lua/cancel.lua``:
``T:runs``, ``T:beats``) and picks candidates cheaply, outside any lock: runs whose last
heartbeat is older than the timeout, whose ``pl-abandon-after-ms`` passed, or that a standing
cancellation covers (a tenant marked gone, a key cancelled upstream). Each candidate is then
re-checked and, if it still must stop, stopped in one atomic step (``cn_settle``) through the
same transition as every other cancellation. A heartbeat that lands between the pick and the
step wins: the run is left alone. Every stop is logged with its reason.

Whose clock: Redis's. The heartbeats are recorded by the Redis server's clock (members send how
long ago they beat, ``cn_sync``), the candidates are picked against the server's ``TIME``, read
with the runs, and ``cn_settle`` reads it itself, so a member whose host's clock runs a minute
ahead does not find every other member's runs a minute silent, nor one a minute behind miss a
hung run. A run's ``pl-abandon-after-ms``, which a client wrote with its own clock, is judged
by Redis's too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from pipeline.cancel.functions import CancelFunctions
from pipeline.cancel.target import Facts, Selectors

log = logging.getLogger(__name__)


class Reconciler:
    """Sweeps the registered long work of some lanes (any member may run one; it is idempotent)."""

    def __init__(self, functions: CancelFunctions, timeouts_ms: Mapping[str, int]) -> None:
        """Sweep the lanes of ``timeouts_ms`` (lane -> heartbeat timeout in ms)."""
        self._functions = functions
        self._timeouts_ms = dict(timeouts_ms)

    async def candidates(self, selectors: Selectors, now_ms: int | None = None) -> list[str]:
        """Run ids that look as if they must stop (re-checked by :meth:`settle`).

        Judged at ``now_ms``, by default the Redis server's time, read with the runs.
        """
        client, keys = self._functions.client, self._functions.keys
        pipe = client.pipeline(transaction=False)
        pipe.hgetall(keys.runs)
        pipe.zrange(keys.beats, 0, -1, withscores=True)
        pipe.time()  # the heartbeats are recorded by Redis's clock, so they are judged by it
        raw_runs, raw_beats, (now_s, now_us) = await pipe.execute()
        now = int(now_s) * 1000 + int(now_us) // 1000 if now_ms is None else now_ms
        beats = {ident.decode(): int(score) for ident, score in raw_beats}
        found = []
        for raw_ident, raw in raw_runs.items():
            ident, record = raw_ident.decode(), json.loads(raw)
            lane = record.get("lane")
            timeout = self._timeouts_ms.get(lane)
            if timeout is None:
                continue
            facts = Facts(
                record.get("event"),
                record.get("key"),
                record.get("tenant"),
                int(record.get("origin", 0)),
                int(record.get("abandon", 0)),
            )
            stale = beats.get(ident, 0) <= now - timeout
            if stale or selectors.reason(lane, facts, now) is not None:
                found.append(ident)
        return found

    async def settle(self, ident: str, lane: str, now_ms: int | None = None) -> str:
        """Re-check one candidate and stop it if it still must stop; returns the verdict.

        Judged at ``now_ms``, by default the Redis server's time (read by ``cn_settle``).
        """
        verdict = await self._functions.settle(now_ms or 0, self._timeouts_ms[lane], ident)
        if verdict not in ("alive", "gone", "stopping"):
            log.warning("reconciler: %s run %s on lane %s", verdict, ident, lane)
        return verdict

    async def sweep(self, selectors: Selectors, now_ms: int | None = None) -> dict[str, str]:
        """One pass over every lane: the verdict of each candidate, by run id."""
        verdicts = {}
        for ident in await self.candidates(selectors, now_ms):
            verdicts[ident] = await self.settle(ident, _lane_of(ident), now_ms)
        return verdicts


def _lane_of(ident: str) -> str:
    """Run ids are ``lane/member/n``: the lane a run belongs to."""
    return ident.split("/", 1)[0]
