"""A lane is consumed by one group at a time: the group lease its members hold in Redis.

A lane's Redis state is the lane's, not a group's: the run guard's start marks and claims, its
parked keys, its ``ctx.once`` records and debounce buffers (all under ``{P:guard:LANE}`` or the
lane's name), and so are its retry-tier and dead-letter topics. Two groups on one lane took each
other's claims every few seconds (``assigned to another member process since they came here``,
partitions revoked as lost) and the second ran nothing; it would also run the first's retry
copies.

So every member that consumes a lane holds the lane's lease (``{P:guard:LANE}:group``, a hash
naming the group, see ``lua/lane_lease.lua``) for :func:`lease_ms` (30 s at least), renewed by
the member's reap tick (about every 2 s, one call per lane, never per message):

- :meth:`LaneLease.wait`, before the member joins its group: a lane held by another group's live
  lease is waited for (one WARNING line when the wait starts, one every
  :data:`WAIT_LINE_EVERY_S`; the member is not ready meanwhile), and taken once free. The lanes
  are taken one by one in one order (sorted by name), and a member that finds one held gives
  back those it took in that look: a waiting member holds no lane, so two groups that each want
  lanes the other took never wait for each other, and a lane is not kept from a group by a
  member that does not consume it yet.
- :meth:`LaneLease.renew`: a lane found held by another group while the member runs (its own
  lease ran out during a Redis outage and the other group took the lane) is one CRITICAL line
  and :class:`LaneTaken`, which stops the member; started again, it waits as above.
- :meth:`LaneLease.confirm`, before a polled batch starts: no Redis call while the last
  renewal is recent (less than half a lease ago, on this host's clock); after a stall (a frozen
  VM, a paused process) it renews first, so a member whose lane another group took meanwhile
  stops before it runs any more of the lane's messages.
- :meth:`LaneLease.leave`, at a graceful stop: the member gives up its hold, and the last live
  member of the group frees the lane at once. A member that crashed holds it until its lease
  runs out.

A Redis out of reach at the first look does not hold the start back (one warning; every tick
tries again). Once another group's lease was seen, the wait goes on while Redis is out of reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Sequence

from redis.asyncio import Redis

from pipeline.errors import PipelineError
from pipeline.reachability import safe_url
from pipeline.redis_functions import FAILED
from pipeline.retry.keys import guard_keys
from pipeline.runtime.lane_lease_functions import Holder, LaneLeaseFunctions

__all__ = [
    "CHECK_EVERY_S",
    "WAIT_LINE_EVERY_S",
    "LaneLease",
    "LaneTaken",
    "host_clock",
    "lease_ms",
]

log = logging.getLogger(__name__)

LEASE_FLOOR_MS = 30_000
"""The shortest lane lease: a Redis blip of a few seconds must not free a running group's lane."""
CHECK_EVERY_S = 2.0
"""How often a waiting member looks at the leases of the lanes it waits for."""
WAIT_LINE_EVERY_S = 30.0
"""How often a waiting member says again what it waits for."""
_LEAVE_S = 5.0
"""The longest a stopping member tries to give its holds up (they run out by themselves)."""


def host_clock() -> float:
    """Seconds on this host's clock that also runs while the host sleeps (else monotonic)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


def lease_ms(liveness_ms: int) -> int:
    """The lane lease of a member whose liveness is ``liveness_ms``: six of them, 30 s at least."""
    return max(LEASE_FLOOR_MS, 6 * liveness_ms)


class LaneTaken(PipelineError):
    """Another group took a lane this member consumes (its CRITICAL line was logged)."""


def redis_where(client: Redis) -> str:
    """The URL of ``client``'s Redis, fit to print (no credentials)."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return "(its Redis Cluster)"
    if "path" in kwargs:
        return safe_url(f"unix://{kwargs['path']}")
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    return safe_url(f"redis://{host}:{port}/{kwargs.get('db') or 0}")


class LaneLease:
    """The leases of the lanes one member of ``group`` consumes."""

    def __init__(
        self,
        redis: Redis,
        prefix: str,
        lanes: Sequence[str],
        group: str,
        *,
        lease_ms: int,
        check_s: float = CHECK_EVERY_S,
        clock: Callable[[], float] = host_clock,
        member: str | None = None,
    ) -> None:
        """Hold ``lanes``' leases (keys under ``prefix``) for ``lease_ms`` after each renewal.

        ``member`` names this member's hold: the stable member name (``--instance``), so a
        member restarted after a crash under the same name takes its old hold over instead of
        leaving it to run out (its graceful stop then frees the lane at once); None: a name of
        this process's own.
        """
        self._functions = LaneLeaseFunctions(redis)
        self._keys = {lane: guard_keys(prefix, lane).group for lane in sorted(set(lanes))}
        self._group = group
        self._lease_ms = lease_ms
        self._check_s = check_s
        self._token = member if member is not None else secrets.token_hex(8)
        self._where = redis_where(redis)
        self._clock = clock
        self._fresh_until = float("-inf")  # on ``clock``: no renewal needed before a batch
        self._renewed_at: float | None = None  # on ``clock``: this member's last full hold
        self._failing = False
        self._taken = False

    async def wait(self, stop: asyncio.Event) -> bool:
        """Hold every lane, waiting for those another group holds; False if ``stop`` came first.

        True at once if Redis cannot be reached at the first look (:meth:`renew` tries again).
        """
        said: dict[str, float] = {}  # each lane waited for: when its line was last logged
        loop = asyncio.get_running_loop()
        while True:
            sent = self._clock()
            try:
                other = await self._take_in_order()
            except FAILED as exc:
                self._unreachable(exc)
                if not said:
                    return True
            else:
                self._reachable()
                if other is None:
                    self._renewed(sent)
                    if said:
                        log.warning(
                            "lane(s) %s free: group %r consumes them now", _names(said), self._group
                        )
                    return True
                lane, holder = other
                now = loop.time()
                if now - said.get(lane, -WAIT_LINE_EVERY_S) >= WAIT_LINE_EVERY_S:
                    said[lane] = now
                    log.warning("%s", self._waiting_line(lane, holder))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._check_s):
                    await stop.wait()
            if stop.is_set():
                return False

    async def renew(self) -> None:
        """Renew every lane's lease (the reap tick); a Redis out of reach is one warning.

        Raises:
            LaneTaken: another group holds a lane now (one CRITICAL line logged); raised once.
        """
        if self._taken:
            return
        sent = self._clock()
        try:
            holders = await self._hold_all()
        except FAILED as exc:
            self._unreachable(exc)
            return
        self._reachable()
        if all(holder.ours for holder in holders.values()):
            self._renewed(sent)
        for lane, holder in holders.items():
            if not holder.ours:
                self._taken = True
                log.critical("%s", self._taken_line(lane, holder))
                raise LaneTaken(
                    f"lane {lane!r} is consumed by group {holder.group!r} now: group"
                    f" {self._group!r} stopped consuming it"
                )

    async def confirm(self) -> None:
        """Before a batch starts: renew now if the last renewal is half a lease old or more.

        No Redis call while the reap tick renews (about every 2 s); after a stall of the
        process or its host the lease may have run out, and another group taken the lane.
        A Redis out of reach is tried again here no sooner than every few seconds.

        Raises:
            LaneTaken: another group holds a lane now (one CRITICAL line logged); raised once.
        """
        if self._taken or self._clock() < self._fresh_until:
            return
        await self.renew()
        if self._failing:
            self._fresh_until = self._clock() + self._check_s

    async def leave(self) -> None:
        """Give up this member's holds; the lanes are free once no live member holds them."""
        try:
            async with asyncio.timeout(_LEAVE_S):
                await asyncio.gather(
                    *(
                        self._functions.leave(key, self._group, self._token)
                        for key in self._keys.values()
                    )
                )
        except (*FAILED, TimeoutError) as exc:
            log_line = self._leave_failed_line(exc)
            if self._renewed_at is None:
                log.info("%s", log_line)
            else:
                log.warning("%s", log_line)

    def _renewed(self, sent: float) -> None:
        """Every lane held at ``sent`` (on ``clock``)."""
        self._renewed_at = sent
        # Redis set the lease's end at or after ``sent``: half a lease is a safe margin.
        self._fresh_until = sent + self._lease_ms / 2000

    def _leave_failed_line(self, exc: BaseException) -> str:
        """What a failed :meth:`leave` means: nothing was held, or the hold runs out by itself."""
        reason = str(exc) or type(exc).__name__
        if self._renewed_at is None:
            return (
                f"group {self._group!r} never held the lease of lane(s) {_names(self._keys)}"
                f" in this member: nothing to give up (Redis {self._where} out of reach: {reason})"
            )
        ago = max(0.0, self._clock() - self._renewed_at)
        return (
            f"could not give up the lease of lane(s) {_names(self._keys)} held for group"
            f" {self._group!r} in Redis {self._where} ({reason}): this member's hold ends"
            f" {_seconds(self._lease_ms)} s after its last renewal ({ago:.0f} s ago), and the"
            " lane is free for another group once no member of this one holds it"
        )

    async def _take_in_order(self) -> tuple[str, Holder] | None:
        """Take the lanes one by one (in name order); None once all are held.

        At the first lane another group holds, the lanes taken in this look are given back
        (this member's hold only: other members of the group keep theirs) and that lane and its
        holder are the answer.
        """
        taken: list[str] = []
        for lane, key in self._keys.items():
            holder = await self._functions.hold(key, self._group, self._token, self._lease_ms)
            if not holder.ours:
                for given in taken:
                    await self._functions.leave(self._keys[given], self._group, self._token)
                return lane, holder
            taken.append(lane)
        return None

    async def _hold_all(self) -> dict[str, Holder]:
        replies = await asyncio.gather(
            *(
                self._functions.hold(key, self._group, self._token, self._lease_ms)
                for key in self._keys.values()
            ),
            return_exceptions=True,
        )
        holders: dict[str, Holder] = {}
        for lane, reply in zip(self._keys, replies, strict=True):
            if isinstance(reply, BaseException):
                raise reply
            holders[lane] = reply
        return holders

    def _unreachable(self, exc: BaseException) -> None:
        if self._failing:
            return
        self._failing = True
        log.warning(
            "could not hold the group lease of lane(s) %s in Redis %s for group %r: %s; a lane"
            " is consumed by one group at a time, and this is looked at again every few seconds",
            _names(self._keys),
            self._where,
            self._group,
            exc,
        )

    def _reachable(self) -> None:
        if self._failing:
            self._failing = False
            log.info(
                "group %r holds the lease of lane(s) %s again", self._group, _names(self._keys)
            )

    def _waiting_line(self, lane: str, holder: Holder) -> str:
        return (
            f"lane {lane!r} is consumed by group {holder.group!r} (its lease in Redis"
            f" {self._where} renewed {holder.age_s:.0f} s ago); a lane is consumed by one group"
            f" at a time: stop group {holder.group!r} (its lease ends"
            f" {_seconds(holder.lease_ms)} s after its last member stops) or run this lane under"
            " the same group"
        )

    def _taken_line(self, lane: str, holder: Holder) -> str:
        return (
            f"lane {lane!r} is consumed by group {holder.group!r} now (its lease in Redis"
            f" {self._where} renewed {holder.age_s:.0f} s ago): group {self._group!r}'s lease"
            " ran out (Redis out of reach for longer than it?) and the other group took the lane;"
            " a lane is consumed by one group at a time, so this member stops. Started again, it"
            f" waits until group {holder.group!r} stops; stop that group or run this lane under"
            " the same group"
        )


def _names(lanes: Iterable[str]) -> str:
    return ", ".join(repr(lane) for lane in lanes)


def _seconds(ms: int) -> str:
    return f"{ms / 1000:g}"
