"""Fair concurrency throttles held in Redis: at most N holders per key, fair waiters, leases.

A *key* (``org:acme``, ``sub:acme/t42``, ``job:doc-17``) has a concurrency limit. A job asks
for all its keys at once with :meth:`Throttle.acquire`; one call of ``thr_acquire``
(``lua/throttle.lua``) takes the keys in :func:`~pipeline.admission.order.canonical_order`
while they have room and queues the job on the first full one, keeping what it took.
:meth:`Throttle.release` frees the slots and, in the same atomic step, hands each to the next
waiter (highest priority first, FIFO within a priority), which continues its own acquisition; a
waiter that ends up holding all its keys is woken through its member's wake list
(:mod:`pipeline.admission.wake`). So:

* never more holders than the limit; a newcomer never takes a slot a waiter is owed;
* no deadlock (canonical order) and no livelock (waiters are never bounced);
* one round trip to acquire and one to release; a waiter costs nothing until it is woken;
* every permit, held or waiting, has a lease that this member renews in one call per
  ``lease_ms / 3`` for all its permits; a killed member's slots return within the lease and
  go to the next waiters, and its waiters leave the queues.

If Redis cannot be reached (or the namespace's Redis Cluster slot is migrating),
:meth:`Throttle.acquire` fails open: it returns an unconditional permit
(``Permit.unconditional``), logs a warning and counts it in ``fail_open``; waiting acquisitions
are granted the same way once heartbeats have failed for a whole lease. If Redis comes back
without the throttle state (a restart without persistence), the heartbeat finds this member's
permits unknown: waiting ones are queued again in their original order, held ones keep running
and are no longer counted (see ``docs/admission.md``).

Usage::

    throttle = Throttle(redis, prefix="pl", namespace="default", default_limit=8)
    await throttle.start()
    async with throttle.hold(["org:acme", "sub:acme/t42"], priority=5):
        await handle(event)
    await throttle.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline.admission import keys as k
from pipeline.admission.adaptive import Feedback, release_args
from pipeline.admission.functions import ThrottleFunctions
from pipeline.admission.order import SCOPE_RANK, canonical_order
from pipeline.admission.permit import Permit, default_member_id
from pipeline.admission.shares import MAX_LIMIT, Share, factor_text
from pipeline.admission.status import MAX_PRIORITY, ThrottleStatus, read_active_keys, read_status
from pipeline.admission.wake import WakeListener, dedicated_client
from pipeline.config import Settings
from pipeline.errors import ThrottleClosed
from pipeline.redis_channel import channel_of
from pipeline.redis_functions import FAILED

__all__ = [
    "MAX_LIMIT",
    "MAX_PRIORITY",
    "SCOPE_RANK",
    "Permit",
    "Throttle",
    "ThrottleStatus",
    "canonical_order",
    "default_member_id",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
_LIMITS_A_CALL = 500
"""Keys one ``set_limits`` call sets: a Redis call of a few milliseconds at most."""
_UNAVAILABLE = (
    rexc.ConnectionError,
    rexc.TimeoutError,
    OSError,
    rexc.ClusterError,
    rexc.TryAgainError,
    rexc.AskError,
    rexc.RedisClusterException,
)
"""Redis out of reach (a Redis Cluster with no node answering: ``RedisClusterException``), or
its Redis Cluster slot migrating: refused (``TRYAGAIN``, an ``ASK`` or ``MOVED`` loop, redis-py's
``TTL exhausted.``) before the call ran, until the slot has moved."""


class Throttle:
    """One member process's handle on the throttles of a namespace.

    Attributes ``roundtrips``, ``acquired``, ``waited``, ``fail_open`` and ``lost`` are plain
    counters for metrics: Redis calls made, permits granted (by Redis), acquisitions that had to
    wait, permits granted unconditionally because Redis was unavailable, and permits whose state
    Redis no longer had (expired or lost in a restart).
    """

    def __init__(
        self,
        client: Redis,
        *,
        prefix: str = "pl",
        namespace: str = "default",
        default_limit: int = 10,
        lease_ms: int = 30_000,
        wake_block_s: float = 2.0,
        member: str | None = None,
        wake_client: Redis | None = None,
    ) -> None:
        """Use ``client``; every member of a namespace must share ``default_limit``.

        Args:
            client: Redis client for the calls; the wake channel opens its own connection
                from the same connection settings.
            prefix: key prefix (``settings.redis.key_prefix``).
            namespace: the set of throttle keys that may be acquired together (one hash tag).
            default_limit: limit of a key that has none set with :meth:`set_limit`.
            lease_ms: default lease of a permit; renewed every ``lease_ms / 3`` while live.
            wake_block_s: how long one ``BLPOP`` on the wake list blocks (shutdown latency).
            member: this process's id (default: host, pid and a random suffix).
            wake_client: the client for the blocking wake read (default: a one-connection
                copy of ``client``); pass one for clients without a connection pool, such as
                ``redis.asyncio.RedisCluster``. The throttle closes it.
        """
        if default_limit < 0 or lease_ms < 30:  # noqa: PLR2004 - renewal needs >= 10 ms ticks
            raise ValueError("default_limit must be >= 0 and lease_ms >= 30")
        self.client = client
        self.prefix = prefix
        self.namespace = namespace
        self.default_limit = default_limit
        self.lease_ms = lease_ms
        self.member = member or default_member_id()
        self._functions = ThrottleFunctions(
            client, prefix, namespace, member=self.member, default_limit=default_limit
        )
        self._wake = WakeListener(
            wake_client or dedicated_client(client, wake_block_s + 5.0),
            k.wake(prefix, namespace, self.member),
            self._on_wake,
            block_s=wake_block_s,
        )
        self._live: dict[str, Permit] = {}
        self._waiting: dict[str, asyncio.Future[Permit]] = {}
        self._confirmed_at: dict[str, float] = {}
        """Loop time at which each live permit's last acquire or renewal was sent: its lease in
        Redis runs at least ``lease_ms`` from then."""
        self._suspect: set[str] = set()
        """Waiting permits found lapsed and queued again: a wake for one may predate that."""
        self._requeueing: set[str] = set()
        """Lapsed waiting permits not queued again yet: the heartbeat leaves them out."""
        self._beat_lease_ms = lease_ms
        """The lease whose third the heartbeat sleeps now (the shortest live one's)."""
        self._shorter_lease = asyncio.Event()
        self._pool_calls = _pool_share(client)
        """Bounds this throttle's calls that go through redis-py's pool (no function channel)."""
        self._renewer: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        self.roundtrips = 0
        self.acquired = 0
        self.waited = 0
        self.fail_open = 0
        self.lost = 0
        self.wakes = 0
        """Waiting permits completed by a hand-over (through the wake list or a reply)."""
        self.wake_delays_ms: deque[float] = deque(maxlen=4096)
        """Recent delays from a hand-over in Redis to this member reading its wake, in ms
        (Redis clock to local clock, so only as good as their agreement)."""

    @classmethod
    def from_settings(cls, client: Redis, settings: Settings, **overrides: Any) -> Throttle:
        """A throttle configured by ``settings.throttle`` and ``settings.redis.key_prefix``."""
        t = settings.throttle
        options: dict[str, Any] = {
            "prefix": settings.redis.key_prefix,
            "namespace": t.namespace,
            "default_limit": t.default_limit,
            "lease_ms": t.lease_ms,
            "wake_block_s": t.wake_block_s,
            **overrides,
        }
        return cls(client, **options)

    async def start(self) -> None:
        """Load the Lua library (if Redis is up) and start the wake listener and lease renewer."""
        with contextlib.suppress(*_UNAVAILABLE):
            await self._functions.ensure_loaded()
        self._wake.start()
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renew_loop(), name="throttle renewer")

    async def close(self) -> None:
        """Stop the background tasks; waiting acquisitions are withdrawn and fail with an error.

        Release held permits before closing: after it their leases are no longer renewed.
        """
        self._closed.set()
        for holder, future in list(self._waiting.items()):
            if not future.done():
                future.set_exception(ThrottleClosed("throttle closed while waiting"))
            await self._withdraw(holder)
        if self._renewer is not None:
            (ended,) = await asyncio.gather(self._renewer, return_exceptions=True)
            self._renewer = None
            if isinstance(ended, Exception):  # the rest of the close still runs
                log.error("throttle lease renewer had failed: %r", ended)
        await self._wake.close()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def acquire(
        self, keys: Sequence[str], *, priority: int = 0, lease_ms: int | None = None
    ) -> Permit:
        """Wait until this job holds a slot on every key; one round trip, then no polling.

        Args:
            keys: throttle keys of the job, in any order (duplicates are ignored); a lone
                surrogate in one is taken as U+FFFD (:func:`~pipeline.admission.keys.key_text`).
            priority: 0..1000; a higher priority is served first, FIFO within a priority.
            lease_ms: the permit's lease (default: the throttle's); it is renewed while live.

        Returns:
            The permit; pass it to :meth:`release` when the job ends. If Redis is unavailable
            it is unconditional (fail open).

        Raises:
            ValueError: priority out of range or no keys.
        """
        permit = self._new_permit(keys, priority, lease_ms)
        future: asyncio.Future[Permit] = asyncio.get_running_loop().create_future()
        self._waiting[permit.holder] = future  # before the call: a wake may overtake its reply
        self._track(permit)
        self._confirmed_at[permit.holder] = asyncio.get_running_loop().time()
        try:
            state = await self._call_acquire(permit, try_only=False)
            if state == "granted":
                self._waiting.pop(permit.holder, None)
                self.acquired += 1
                return permit
            self.waited += 1
            return await future
        except _UNAVAILABLE as exc:
            self._forget(permit.holder)
            self._spawn(self._withdraw_when_back(permit))
            return self._fail_open(permit, exc)
        except asyncio.CancelledError:
            # Cancelled while queued (or while the call was in flight): leave the queue.
            self._spawn(self._withdraw(permit.holder))
            raise
        except BaseException:
            self._forget(permit.holder)
            raise

    async def try_acquire(
        self, keys: Sequence[str], *, priority: int = 0, lease_ms: int | None = None
    ) -> Permit | None:
        """Take every key now if all have room and no waiters, else take nothing (one call).

        Returns:
            The permit, or ``None`` if a key is full or has waiters. Unconditional if Redis is
            unavailable.
        """
        permit = self._new_permit(keys, priority, lease_ms)
        try:
            state = await self._call_acquire(permit, try_only=True)
        except _UNAVAILABLE as exc:
            self._spawn(self._withdraw_when_back(permit))
            return self._fail_open(permit, exc)
        if state != "granted":
            return None
        self._track(permit)
        self.acquired += 1
        return permit

    async def release(self, permit: Permit, feedback: Sequence[Feedback] = ()) -> None:
        """Free the permit's slots; Redis hands them to the next waiters in the same step.

        ``feedback`` on adaptive keys (:mod:`pipeline.admission.adaptive`) is applied in the
        same call, before the slots go out. Idempotent; an unconditional permit needs nothing.
        If Redis is unavailable the slots return when the lease lapses.
        """
        if permit.unconditional:
            return
        self._forget(permit.holder)
        try:
            released = await self._call(
                self._functions.release(permit.holder, release_args(feedback))
            )
            self._woken(released.woken)
            closed_for_ms = max((f.retry_after_ms for f in feedback), default=0)
            if closed_for_ms:
                self._spawn(self._reopen_after(closed_for_ms / 1000 + 0.02))
        except FAILED as exc:
            log.warning("throttle release of %s failed, lease will lapse: %s", permit.holder, exc)

    @contextlib.asynccontextmanager
    async def hold(
        self, keys: Sequence[str], *, priority: int = 0, lease_ms: int | None = None
    ) -> AsyncIterator[Permit]:
        """:meth:`acquire` on entry and :meth:`release` on exit."""
        permit = await self.acquire(keys, priority=priority, lease_ms=lease_ms)
        try:
            yield permit
        finally:
            await self.release(permit)

    async def set_limit(self, key: str, limit: int | None) -> None:
        """Set ``key``'s limit (``None``: back to the default); new room goes to its waiters."""
        if limit is not None and not 0 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit must be 0..{MAX_LIMIT} (got {limit})")
        self._woken((await self._call(self._functions.set_limit(k.key_text(key), limit))).woken)

    async def set_limits(self, limits: Mapping[str, int | None]) -> None:
        """:meth:`set_limit` for every key of ``limits``, a few hundred keys a call."""
        for limit in limits.values():
            if limit is not None and not 0 <= limit <= MAX_LIMIT:
                raise ValueError(f"limit must be 0..{MAX_LIMIT} (got {limit})")
        pairs = [(k.key_text(key), limit) for key, limit in limits.items()]
        for start in range(0, len(pairs), _LIMITS_A_CALL):
            chunk = pairs[start : start + _LIMITS_A_CALL]
            self._woken((await self._call(self._functions.set_limits(chunk))).woken)

    async def set_shares(self, shares: Mapping[str, tuple[int, Share]]) -> None:
        """Set each key's limit and its :class:`~pipeline.admission.shares.Share` (the fleet's).

        While the fleet's factor is set (:meth:`set_factor`) a key with a share is admitted up
        to the share at that factor; the limit is what applies without it. A plain
        :meth:`set_limit` or :meth:`set_limits` of the key drops its share.
        """
        triples: list[tuple[str, int, str]] = []
        for key, (limit, share) in shares.items():
            if not 0 <= limit <= MAX_LIMIT:
                raise ValueError(f"limit must be 0..{MAX_LIMIT} (got {limit})")
            if min(share.ceiling, share.floor, share.dedicated) < 0:
                raise ValueError(f"a share's parts must be >= 0 (got {share})")
            triples.append((k.key_text(key), limit, share.encoded()))
        for start in range(0, len(triples), _LIMITS_A_CALL):
            chunk = triples[start : start + _LIMITS_A_CALL]
            self._woken((await self._call(self._functions.set_shares(chunk))).woken)

    async def set_factor(self, factor: float, ttl_ms: int) -> None:
        """Admit every key with a share at ``factor`` from now, for ``ttl_ms`` unless set again.

        Room it gives goes to a key's waiters at the key's next release or limit set.
        """
        self.roundtrips += 1
        await self.client.set(
            k.fleet_factor(self.prefix, self.namespace), factor_text(factor), px=ttl_ms
        )

    async def prune_shares(self) -> int:
        """Drop the shares of up to some 500 keys left without a limit; returns how many.

        A member of an earlier release that forgets a gone org clears its limit but not its
        share, which no longer counts then but would stay in Redis; the fleet's tick calls this
        once, each call going on from where the last stopped.
        """
        return await self._call(self._functions.prune_shares())

    async def set_reserve(self, key: str, slots: int | None, min_priority: int = 0) -> None:
        """Keep the last ``slots`` of ``key``'s limit for permits of ``min_priority`` or more.

        Lower priorities see the limit minus ``slots`` (trunk reservation: they borrow the rest
        of the reserve while it is unused). ``None`` stops keeping any; freed room goes to the
        waiters. Sized by :mod:`pipeline.admission.reserve`.
        """
        if slots is not None and not 0 <= slots <= MAX_LIMIT:
            raise ValueError(f"reserve slots must be 0..{MAX_LIMIT} (got {slots})")
        if not 0 <= min_priority <= MAX_PRIORITY:
            raise ValueError(f"priority must be 0..{MAX_PRIORITY}")
        reserved = await self._call(
            self._functions.set_reserve(k.key_text(key), slots, min_priority)
        )
        self._woken(reserved.woken)

    async def status(self, key: str) -> ThrottleStatus:
        """Read ``key``'s limit, holders, waiters and recent grants in one transaction."""
        self.roundtrips += 1
        return await read_status(
            self.client, self.prefix, self.namespace, k.key_text(key), self.default_limit
        )

    async def active_keys(self) -> list[str]:
        """Throttle keys of the namespace that have holders or waiters now, sorted."""
        self.roundtrips += 1
        return await read_active_keys(self.client, self.prefix, self.namespace)

    # -- internals -------------------------------------------------------------------------------

    def _new_permit(self, keys: Sequence[str], priority: int, lease_ms: int | None) -> Permit:
        if not keys:
            raise ValueError("acquire needs at least one key")
        if not 0 <= priority <= MAX_PRIORITY:
            raise ValueError(f"priority must be 0..{MAX_PRIORITY}")
        return Permit(
            holder=uuid.uuid4().hex,
            keys=canonical_order([k.key_text(key) for key in keys]),
            priority=priority,
            lease_ms=lease_ms or self.lease_ms,
        )

    async def _call_acquire(self, permit: Permit, *, try_only: bool) -> str:
        acquired = await self._call(
            self._functions.acquire(
                permit.holder, permit.priority, permit.lease_ms, permit.keys, try_only=try_only
            )
        )
        self._woken(acquired.woken)
        return acquired.state

    async def _call(self, call: Coroutine[Any, Any, T]) -> T:
        """Make one Redis call, queued in this process while the client's pool is taken.

        A client without a function channel (TLS, a Unix socket) sends each call on a
        connection of redis-py's pool, which refuses one past its ``max_connections`` with a
        ``ConnectionError`` ("Too many connections") rather than wait. Taken as Redis being
        down, that failed open every acquisition of a burst beyond the pool: 300 tenants polled
        at once ran 200 at a time on a key limited to 4. So at most half the pool's connections
        carry throttle calls at once (the rest stay for the member's other Redis users); the
        others wait their turn here.
        """
        self.roundtrips += 1
        if self._pool_calls is None or channel_of(self.client) is not None:
            return await call
        try:
            await self._pool_calls.acquire()
        except BaseException:
            call.close()  # never started
            raise
        try:
            return await call
        finally:
            self._pool_calls.release()

    def _fail_open(self, permit: Permit, exc: BaseException) -> Permit:
        self.fail_open += 1
        log.warning("throttle unavailable, admitting %s without it: %s", list(permit.keys), exc)
        return Permit(
            permit.holder, permit.keys, permit.priority, permit.lease_ms, unconditional=True
        )

    def _forget(self, holder: str) -> None:
        self._live.pop(holder, None)
        self._waiting.pop(holder, None)
        self._confirmed_at.pop(holder, None)
        self._suspect.discard(holder)

    def _grant(self, holder: str, *, verified: bool = False) -> None:
        """Complete a waiting permit that Redis granted.

        A grant read once the permit's lease may have lapsed (this process stopped or stalled
        for a lease: a ``SIGSTOP``, a VM pause), or for a permit found lapsed and queued again
        since, may be stale: Redis expired the permit and handed its slots on, so running the
        job would exceed the limit beside their new holders. Such a grant is checked with
        Redis first (one renewal of that permit) and completes only if Redis still has it
        granted; a lapsed one is queued again.
        """
        permit = self._live.get(holder)
        if not verified and permit is not None and holder in self._waiting:
            confirmed_at = self._confirmed_at.get(holder)
            now = asyncio.get_running_loop().time()
            stale = confirmed_at is None or (now - confirmed_at) * 1000 >= permit.lease_ms
            if stale or holder in self._suspect:
                self._spawn(self._verify(holder))
                return
        self._suspect.discard(holder)
        future = self._waiting.pop(holder, None)
        permit = self._live.get(holder)
        if future is not None and permit is not None and not future.done():
            self.acquired += 1
            future.set_result(permit)

    def _woken(self, entries: Sequence[Any]) -> None:
        """Complete this member's permits that a call's hand-over granted (no wake list)."""
        for entry in entries:
            self._on_wake(_text(entry))

    def _on_wake(self, message: str) -> None:
        holder, _, granted_ms = message.partition(" ")
        self.wakes += 1
        if granted_ms:
            self.wake_delays_ms.append(time.time() * 1000 - int(granted_ms))
        self._grant(holder)

    async def _withdraw(self, holder: str) -> None:
        self._forget(holder)
        with contextlib.suppress(*FAILED):  # its lease lapses
            self._woken((await self._call(self._functions.release(holder))).woken)

    async def _withdraw_when_back(self, permit: Permit) -> None:
        """Withdraw a permit whose acquisition failed, once Redis answers again.

        A call that timed out may have run in Redis all the same: its permit would then hold
        slots (or a place in the queue) owned by nobody until its lease lapsed, while the job
        runs failed open beside it. Tried at growing intervals until Redis answers or the lease
        has lapsed anyway (withdrawing a permit that does not exist changes nothing).
        """
        deadline = asyncio.get_running_loop().time() + permit.lease_ms / 1000
        pause_s = 0.1
        while not self._closed.is_set():
            try:
                self._woken((await self._call(self._functions.release(permit.holder))).woken)
            except FAILED:
                if asyncio.get_running_loop().time() + pause_s > deadline:
                    return  # its lease lapses by itself
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closed.wait(), pause_s)
                pause_s = min(pause_s * 2, 5.0)
            else:
                return

    async def _reopen_after(self, delay_s: float) -> None:
        """Reopen keys a Retry-After closed once it passed: any throttle call reopens due keys.

        Waiters do not wait for a heartbeat to do it; if this member is gone by then, the next
        call of any other member (at the latest its heartbeat) does.
        """
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closed.wait(), delay_s)
            return
        with contextlib.suppress(*FAILED):  # the next call of any member reopens them
            self._woken((await self._call(self._functions.renew())).woken)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _track(self, permit: Permit) -> None:
        """Add ``permit`` to the live ones; wake the heartbeat if it sleeps past its renewal."""
        self._live[permit.holder] = permit
        if permit.lease_ms < self._beat_lease_ms:
            self._shorter_lease.set()

    async def _renew_loop(self) -> None:
        loop = asyncio.get_running_loop()
        down_since: float | None = None
        while not self._closed.is_set():
            leases = [p.lease_ms for p in self._live.values()] or [self.lease_ms]
            # A permit of a shorter lease taken while this sleeps (a lane's throttle.lease under
            # the default, while idle) wakes it to sleep its own third from then instead: it
            # slept the default's third, and such permits lapsed before their first renewal.
            self._beat_lease_ms = min(leases)
            self._shorter_lease.clear()
            closed = asyncio.ensure_future(self._closed.wait())
            shorter = asyncio.ensure_future(self._shorter_lease.wait())
            try:
                done, _ = await asyncio.wait(
                    (closed, shorter),
                    timeout=self._beat_lease_ms / 3000,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                closed.cancel()
                shorter.cancel()
            if shorter in done or self._closed.is_set() or not self._live:
                continue
            try:
                await self._renew_once()
                down_since = None
            except FAILED as exc:
                # Unreachable, or answering errors (out of memory, a read-only replica after a
                # failover, ACL): a spell shorter than the lease changes nothing, the permits are
                # still in Redis; past it, waiters are let go (fail open) rather than held.
                if not isinstance(exc, _UNAVAILABLE):
                    log.warning("throttle lease renewal refused, renewing again shortly: %s", exc)
                now = loop.time()
                down_since = now if down_since is None else down_since
                if (now - down_since) * 1000 >= min(leases):
                    self._fail_open_waiters(exc)

    async def _verify(self, holder: str) -> None:
        """Complete ``holder`` only if Redis has it granted; failing that, the heartbeat does."""
        with contextlib.suppress(*FAILED):
            await self._renew_once([holder])

    async def _renew_once(self, only: Sequence[str] | None = None) -> None:
        wanted = list(self._live) if only is None else [h for h in only if h in self._live]
        holders = [h for h in wanted if h not in self._requeueing]
        if not holders:
            return
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        renewed = await self._call(self._functions.renew(holders))
        self._woken(renewed.woken)
        states = renewed.letters
        lapsed: list[Permit] = []
        lost_held: list[Permit] = []
        for holder, state in zip(holders, states, strict=True):
            permit = self._live.get(holder)
            if permit is None:
                continue  # released meanwhile
            if state in ("g", "w"):
                self._confirmed_at[holder] = sent_at
            if state == "g":
                self._grant(holder, verified=True)  # a wake that was lost (or not read yet)
            elif state == "x" and holder in self._waiting and holder not in self._requeueing:
                self.lost += 1
                self._suspect.add(holder)  # a wake read from now on may be the lapsed one's
                lapsed.append(permit)
            elif state == "x" and holder in self._waiting:
                continue  # being queued again
            elif state == "x":
                self.lost += 1
                self._live.pop(holder, None)
                self._confirmed_at.pop(holder, None)
                lost_held.append(permit)
        self._report_lost_held(lost_held)
        self._requeue_lapsed(lapsed)

    def _report_lost_held(self, lost_held: list[Permit]) -> None:
        """One line for the held permits a heartbeat found lapsed (their jobs still run)."""
        if not lost_held:
            return
        log.warning(
            "throttle %s: %d held permit(s) of member %s lapsed in Redis while their jobs ran "
            "(lease %d ms; this process, its event loop or Redis stalled for longer, or Redis "
            "lost its state): their slots may have gone to other jobs, so those keys run over "
            "their limits until these jobs end; a lane's longer throttle.lease "
            "(PIPELINE_THROTTLE__LEASE_MS for others) keeps them through such stalls",
            self.namespace,
            len(lost_held),
            self.member,
            min(p.lease_ms for p in lost_held),
        )

    def _requeue_lapsed(self, lapsed: list[Permit]) -> None:
        """Queue waiting permits Redis expired (or lost) again, in their order, in one line.

        They are queued again in the background, one call each in order, so the heartbeat goes
        on renewing this member's other permits meanwhile: queued again inside the heartbeat,
        a thousand lapsed waiters held it for a thousand round trips, and the permits it did not
        renew meanwhile lapsed in turn.
        """
        if not lapsed:
            return
        log.warning(
            "throttle %s: %d waiting permit(s) of member %s lapsed in Redis before their renewal "
            "(lease %d ms; this process, its event loop or Redis stalled for longer, or Redis "
            "lost its state): queued again, in their order, behind the waiters already there; "
            "a lane's longer throttle.lease (PIPELINE_THROTTLE__LEASE_MS for others) keeps "
            "their places through such stalls",
            self.namespace,
            len(lapsed),
            self.member,
            min(p.lease_ms for p in lapsed),
        )
        self._requeueing.update(p.holder for p in lapsed)
        self._spawn(self._requeue(lapsed))

    async def _requeue(self, lapsed: list[Permit]) -> None:
        loop = asyncio.get_running_loop()
        try:
            for permit in lapsed:
                holder = permit.holder
                if holder not in self._waiting or self._closed.is_set():
                    self._requeueing.discard(holder)
                    continue  # cancelled or failed open meanwhile
                self._confirmed_at[holder] = loop.time()
                state = await self._call_acquire(permit, try_only=False)
                self._requeueing.discard(holder)
                if state == "granted":
                    self._grant(holder, verified=True)
        except FAILED:
            pass  # the heartbeat finds those left lapsed again and queues them then
        finally:
            self._requeueing.difference_update(p.holder for p in lapsed)

    def _fail_open_waiters(self, exc: BaseException) -> None:
        for holder, future in list(self._waiting.items()):
            permit = self._live.get(holder)
            self._forget(holder)
            if permit is not None and not future.done():
                future.set_result(self._fail_open(permit, exc))


def _pool_share(client: Redis) -> asyncio.Semaphore | None:
    """Half the connections of ``client``'s pool, for the throttle's calls; None if unbounded.

    A Redis Cluster client keeps a pool per node without such a small bound: it needs none.
    """
    pool = getattr(client, "connection_pool", None)
    most = getattr(pool, "max_connections", None)
    if not isinstance(most, int) or most >= 2**31 - 1:
        return None
    return asyncio.Semaphore(max(1, most // 2))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
