"""Claimed ranges: first deliveries run without a Redis call, and a crash is still caught.

The run guard's exact path (``runtime/starts.py``) writes a start mark for every message and
waits for it before the handler runs, so a crash in the handler is always counted. That is one
suspension and a share of a Redis call per message. A :class:`LaneClaims` lets most messages skip
it. Per partition, this member process *claims* the offsets it polls, ahead of them:

* **Claim before work.** Before a poll batch enters the chain, the claim covers it: a claim
  reaches ``ahead`` offsets past what was polled, and is grown by ``ahead`` in one ``HSET`` per
  partition once a batch is past its middle, in the background, so the batches after it find
  their offsets claimed and do not wait. Only a batch that reaches past its claim (a jump, or
  Redis slower than the poll) waits for the write. A first delivery above every range another
  process claimed runs at once, with no start mark. Its end is implied by the commit.
* **Inheritance.** A range claimed by another process when the partition was assigned here is
  *inherited*. That process may have started any of it and crashed, or may still be running
  it after a stall. Messages of an inherited range take the exact path, with a start mark each.
  While that process is alive and keeps its claim, they wait, as a ``busy`` copy does. So a
  crash is caught one owner later: the first crash on a claimed message goes uncounted (it
  ran, if at all, beside the others of its range, and nothing tells them apart), and from the
  next owner on it is counted as before. A poison message whose first crash struck under a
  claim is dead-lettered after ``poison_after`` + 1 crashes; the messages claimed beside it
  are not blamed. Running the whole inherited range alone instead would hold the inheritor to
  one message at a time, for as long as that range takes, after every crash.
* **Parked keys (ordered lanes).** A message whose key may be parked takes the exact path too.
  The keys parked when a partition is assigned are loaded then, at every assignment: a
  previous owner may have parked keys since the last one. Keys this member parks are
  added as it parks them, and a key leaves the set when the exact path next says ``process``.
  Only the owner of a partition parks the keys of its first deliveries, so nothing else can
  park them behind its back; a stalled previous owner's work is inherited, and that path sees
  its parking.
* **Taken over.** The claims of a partition name its *owner*, the process it was assigned to
  last; an assignment reads the other claims and makes this process the owner in one step
  (``gd_take``). A claim is grown or renewed only while this process is still the owner
  (``gd_claim``). A process whose view of the group is stale (a broker dropped it from the
  group and gave its partitions to another member, and it has not heard yet) finds its claim
  refused at its next write: it stops starting messages of that partition and is told
  (``on_superseded``; the member rejoins its group). So the new owner's unmarked first
  deliveries, all above what the stale process had claimed when the new owner took over, never
  run beside the stale process's; what lies below waits for it as any inherited range does.
* **Giving up.** A claim is given up when its partition is revoked, once the work of that
  partition here has ended. While held, it is written again at every tick of the member (which
  also finds a take-over within a tick); left behind by a crash, it expires like the guard's
  other keys, and another process stops waiting for it once this one's liveness (``gd_live``)
  has run out.

A process stalled past its own liveness (a frozen VM, a long pause of its event loop) may
have been taken for dead, and its partitions given to others. Before it starts anything of a
guarded lane again it renews its liveness and writes its claims (:meth:`LaneClaims.confirm`),
so a partition taken over meanwhile is found before any of its messages starts here; one not
taken over is waited for by its next owner, as any live holder's is. While that confirmation
fails (Redis unreachable), its first deliveries take the exact path.

Retry-tier copies, released followers and suspects always take the exact path. When Redis
cannot be reached, nothing is claimed and every message takes the exact path, which fails open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from redis import exceptions as rexc

from pipeline import headers as h
from pipeline.envelope import Message, Position, TopicPartition
from pipeline.retry.guard_store import GuardStore, position
from pipeline.retry.keys import encode_key

log = logging.getLogger(__name__)

_WAIT_FIRST_S = 0.05
_WAIT_MAX_S = 1.0
"""An inherited range of a live process is asked about again after these pauses (doubling)."""
_CONFIRM_EVERY_S = 0.5
"""A stalled process whose confirmation failed tries again at most this often."""
FORGET_PARKED_ABOVE = 10_000
"""Keys a member remembers as maybe parked before it asks Redis which of them still are."""
UNSURE_KEPT_S = 1_200.0
"""The least time the key of a failed parking call is kept through readings of the parked keys.

A call that got no answer may still reach Redis: sent, its bytes may be retransmitted until the
kernel gives up, after about 924.6 s with Linux's default ``tcp_retries2`` (15), even once the
client closed the connection on its timeout. The key is kept longer on a lane whose retry path
is longer (:class:`LaneClaims`): the copy the failed call let through parks it when it fails
again. A reading that starts after both and does not find the key parked lets it go, as it
does any other key."""
UNSURE_KEPT_MAX = 100_000
"""Keys of failed parking calls a lane remembers at most (17 MiB with keys of 16 bytes, counting
the same keys among the maybe-parked ones).

An outage with a flood of distinct keys fails a parking call for each, and each key is kept for
the lane's retry path (an hour at least, days on a lane with long tiers). Past this many the
oldest is let go, and until its retry path is over no first delivery of the lane runs on the
claimed path here: each asks Redis whether its key is parked (a start mark, as on a lane
without claims), so the key let go still waits behind the copy that parks it."""


class LaneClaims:
    """This member process's claims on the main partitions of one guarded lane."""

    def __init__(
        self,
        store: GuardStore,
        topic: str,
        *,
        ordered: bool,
        ahead: int,
        on_superseded: Callable[[list[TopicPartition]], None] | None = None,
    ) -> None:
        """Claim ``topic``'s partitions in ``store``, ``ahead`` offsets past what was polled.

        ``on_superseded`` is told of partitions still assigned here that another process was
        assigned since (this process's view of its group is stale).
        """
        self._store = store
        self.topic = topic
        self._ahead = max(1, ahead)
        self._leftover: set[TopicPartition] = set()
        """Partitions whose claims this process gave up but could not delete (Redis failed):
        their next owners wait for this process while it lives, so deleting them is retried."""
        self._owned: dict[TopicPartition, int] = {}
        """Partitions assigned here, each with the number of its assignment."""
        self._assignments = 0
        self._claimed: dict[TopicPartition, tuple[int, int]] = {}
        """Partitions whose claims were read at assignment: this process's claim (lo, hi)."""
        self._inherited_hi: dict[TopicPartition, int] = {}
        """The highest offset another process claimed when the partition came here."""
        self._holders: dict[TopicPartition, list[str]] = {}
        """Processes whose claims were found at assignment and may still run their work."""
        self._crashed: set[TopicPartition] = set()
        """Partitions a holder of which died with its claim: its range counts as interrupted."""
        self._fast: dict[TopicPartition, tuple[int, int]] = {}
        """The offsets of each partition that may run unmarked: above what was inherited, within
        this process's claim."""
        self._superseded: set[TopicPartition] = set()
        """Partitions assigned here that another process was assigned since: none of their
        messages starts here any more."""
        self._on_superseded = on_superseded
        self._ordered = ordered
        self._confirming: asyncio.Task[None] | None = None
        self._confirm_again_s = -math.inf
        """After a failed confirmation, no other before this time (``time.monotonic``)."""
        self._growing: asyncio.Task[None] | None = None
        """The claims being grown in the background, ahead of the batches."""
        self.maybe_parked: set[str] | None = None if ordered else set()
        """Keys that may be parked (ordered lanes); None until loaded: every key may be."""
        self._parking = 0
        """This member's calls that park a key in Redis and have not returned yet."""
        self._parked_meanwhile: set[str] | None = None
        """While the parked keys are read again: the keys this member learnt of meanwhile."""
        self._unsure: dict[str, float] = {}
        """Keys whose parking call failed, with when (``time.monotonic``): it may still reach
        Redis after a later reading, and the retry copy it let through may park the key, so
        they stay remembered until a message of theirs is found not parked, or a reading
        :attr:`_unsure_kept_s` after the failure does not find them; the oldest first, in
        order, at most :data:`UNSURE_KEPT_MAX`."""
        self._unsure_kept_s = store.ttl_ms / 1000
        """How long after a failed parking call the copy it let through may still park its key:
        the lane's retry path, as the guard keeps finished ids for it (twice the longest tier's
        delay for each attempt, plus an hour). When the call never reached Redis, the copy
        parks the key where it fails again, in whichever member reads its tier, which tells no
        other: forgotten before, the key's next first deliveries here would run at once, ahead
        of the copy of the message before them."""
        self._all_maybe_until_s = -math.inf
        """Until then (``time.monotonic``) every key may be parked: keys of failed parking
        calls were let go past :data:`UNSURE_KEPT_MAX` within their retry path."""
        self._forget_above = FORGET_PARKED_ABOVE

    # -- assignment -------------------------------------------------------------------------

    async def assigned(
        self, tps: Sequence[TopicPartition], committed: Mapping[TopicPartition, Position]
    ) -> None:
        """Read what others claimed of ``tps`` and claim from each committed position on."""
        mine = [tp for tp in tps if tp.topic == self.topic]
        if not mine:
            return
        self._assignments += 1
        for tp in mine:
            self._owned[tp] = self._assignments
            self._leftover.discard(tp)
        try:
            if self._ordered:  # keys the previous owners parked, up to now
                parked = await self._store.parked_keys()
                known = self.maybe_parked
                self.maybe_parked = parked if known is None else known | parked
                if self._parked_meanwhile is not None:
                    self._parked_meanwhile |= parked
            least: dict[TopicPartition, tuple[int, int]] = {}
            for tp in mine:
                lo = committed[tp].offset if tp in committed else 0
                least[tp] = (lo, lo + self._ahead - 1)
            await self._store.live()  # claims are waited for only while their process lives
            taken = await self._store.take_claims(least)
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, %s run every message marked: %s", mine, exc)
            return
        ranges: dict[TopicPartition, tuple[int, int]] = {}
        for tp in mine:
            hi, found = taken[tp]
            ranges[tp] = (least[tp][0], hi)
            self._inherited_hi[tp] = max((top for _, top in found.values()), default=-1)
            self._holders[tp] = sorted(found)
            self._superseded.discard(tp)
        self._claimed_now(ranges)

    def revoked(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Forget ``tps``; returns those of them this process claimed (to give up)."""
        out = []
        for tp in tps:
            self._owned.pop(tp, None)
            if self._claimed.pop(tp, None) is not None:
                out.append(tp)
            self._inherited_hi.pop(tp, None)
            self._holders.pop(tp, None)
            self._crashed.discard(tp)
            self._superseded.discard(tp)
            self._fast.pop(tp, None)
        return out

    async def give_up(self, tps: Sequence[TopicPartition]) -> None:
        """Delete this process's claims on ``tps`` (their work here has ended).

        A partition assigned here again meanwhile keeps the claim its assignment wrote.
        """
        gone = [tp for tp in tps if tp not in self._owned]
        await self._delete(gone)
        await self._settle([tp for tp in gone if tp in self._owned])

    async def _delete(self, tps: Sequence[TopicPartition]) -> None:
        """Delete this process's claims on ``tps``, or keep them to try again at the next tick."""
        if await self._store.unclaim(tps):
            self._leftover.difference_update(tps)
        else:
            self._leftover.update(tps)

    # -- poll batches -----------------------------------------------------------------------

    async def extend(self, tops: Mapping[tuple[str, int], int]) -> None:
        """Claim a poll batch (its top offset per partition) before it runs, and grow ahead.

        Waits only when the batch reaches past a claim; a claim the batch is past the middle of
        is grown in the background.
        """
        needed, soon = self._reach(tops)
        if needed and self._growing is not None:
            await self._growing  # the claims being grown may cover the batch
            needed, soon = self._reach(tops)
        if needed:  # on failure, unclaimed offsets take the exact path
            await self._write(soon | needed, "extend")
        elif soon and self._growing is None:
            self._growing = asyncio.create_task(self._grow(soon))

    def _reach(
        self, tops: Mapping[tuple[str, int], int]
    ) -> tuple[dict[TopicPartition, tuple[int, int]], dict[TopicPartition, tuple[int, int]]]:
        """The claims a batch reaches past (to write before it runs), and those to grow."""
        needed: dict[TopicPartition, tuple[int, int]] = {}
        soon: dict[TopicPartition, tuple[int, int]] = {}
        for tp, (lo, hi) in self._claimed.items():
            top = tops.get((tp.topic, tp.partition))
            if top is None or tp in self._superseded:
                continue
            if top > hi:
                needed[tp] = (lo, top + self._ahead)
            elif top > hi - self._ahead // 2:
                soon[tp] = (lo, hi + self._ahead)
        return needed, soon

    async def _grow(self, ranges: dict[TopicPartition, tuple[int, int]]) -> None:
        try:
            await self._write(ranges, "extend")
        finally:
            self._growing = None

    async def close(self) -> None:
        """Let a claim being grown or confirmed finish (a revoked partition's is then deleted)."""
        for task in (self._growing, self._confirming):
            if task is not None:
                await task

    async def keep(self) -> None:
        """Write every claim again (the member's tick); delete left-overs.

        A quiet partition's claim must outlive any run it covers; a partition another process
        was assigned since is found here within a tick even when nothing is polled (and told
        again at every tick until its revocation); and a claim given up must go even when
        Redis failed its first deletion: the partition's next owner waits for it.
        """
        still = sorted(self._superseded)  # told before, not revoked since: the rejoin failed
        if still and self._on_superseded is not None:
            self._on_superseded(still)
        leftover = [tp for tp in self._leftover if tp not in self._owned]
        self._leftover.clear()
        if leftover:
            await self._delete(leftover)
        held = self._held()
        if held:
            await self._write(held, "renew")

    async def _write(self, ranges: dict[TopicPartition, tuple[int, int]], doing: str) -> None:
        """Write ``ranges`` as this process's claims; failures are logged and leave them as were.

        A partition revoked while the write was under way (a rebalance runs beside the poll
        loop and the commit tick) must not stay claimed: its new owner would wait for this
        process for as long as it lives. Its claim is deleted again, or, if the partition came
        back meanwhile, replaced by the one its new assignment made.
        """
        owned = {tp: self._owned.get(tp) for tp in ranges}
        try:
            refused = await self._store.claim(ranges)
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, could not %s %d claims: %s", doing, len(ranges), exc)
            return
        kept = {tp: claim for tp, claim in ranges.items() if self._owned.get(tp) == owned[tp]}
        self._taken_over([tp for tp in kept if tp in refused])
        self._claimed_now({tp: claim for tp, claim in kept.items() if tp not in refused})
        await self._settle([tp for tp in ranges if tp not in kept])

    def _taken_over(self, tps: list[TopicPartition]) -> None:
        """Another process was assigned ``tps`` since this one was: start nothing more of them."""
        new = [tp for tp in tps if tp not in self._superseded]
        if not new:
            return
        self._superseded.update(new)
        for tp in new:
            self._fast.pop(tp, None)
        log.warning(
            "%s assigned to another member process since they came here: starting nothing"
            " more of them",
            [f"{tp.topic}[{tp.partition}]" for tp in new],
        )
        if self._on_superseded is not None:
            self._on_superseded(new)

    def stalled(self) -> bool:
        """Whether this process's liveness in Redis may have run out (it may be taken for dead)."""
        return time.monotonic() >= self._store.live_until_s

    async def confirm(self) -> None:
        """After a stall: renew the liveness and write the claims, finding any taken over.

        One confirmation at a time; the starts that find one under way wait for it. After a
        failure (Redis unreachable) the next is tried no sooner than ``_CONFIRM_EVERY_S``
        later, and the starts meanwhile take the exact path.
        """
        if self._confirming is None:
            if time.monotonic() < self._confirm_again_s:
                return
            self._confirming = asyncio.create_task(self._confirm())
        await asyncio.shield(self._confirming)

    async def _confirm(self) -> None:
        try:
            await self._store.live()
            if self.stalled():  # the renewal failed (and was logged)
                self._confirm_again_s = time.monotonic() + _CONFIRM_EVERY_S
                return
            held = self._held()
            if held:
                await self._write(held, "confirm")
        finally:
            self._confirming = None

    def _held(self) -> dict[TopicPartition, tuple[int, int]]:
        """This process's claims on the partitions no other process was assigned since."""
        return {tp: claim for tp, claim in self._claimed.items() if tp not in self._superseded}

    def superseded(self, tp: TopicPartition) -> bool:
        """Whether ``tp``, assigned here, was assigned to another process since."""
        return tp in self._superseded

    async def _settle(self, tps: Sequence[TopicPartition]) -> None:
        """Make the claims on ``tps`` in Redis what this process holds now, after a race."""
        if not tps:
            return
        await self._delete([tp for tp in tps if tp not in self._claimed])
        again = {tp: self._claimed[tp] for tp in tps if tp in self._claimed}
        if again:
            await self._write(again, "restore")

    def _claimed_now(self, ranges: dict[TopicPartition, tuple[int, int]]) -> None:
        """``ranges`` are written: they bound the fast path."""
        for tp, claim in ranges.items():
            self._claimed[tp] = claim
            lo, hi = claim
            self._fast[tp] = (max(lo, self._inherited_hi.get(tp, -1) + 1), hi)

    # -- the fast path ----------------------------------------------------------------------

    def unmarked(self, message: Message) -> str | None:
        """``message``'s id if it may run without a start mark, else None."""
        bounds = self._fast.get(message.tp)
        if bounds is None or not bounds[0] <= message.offset <= bounds[1]:
            return None
        if self.stalled():
            return None  # not confirmed since a stall: another process may run its range
        if h.origin(message.topic, message.headers) is not None:
            return None  # a retry-tier copy: its id is its origin's (headers.origin)
        parked = self.maybe_parked
        if parked is None or (parked and encode_key(message.key) in parked):
            return None
        if self._all_maybe_until_s > time.monotonic():
            return None  # keys of failed parking calls were let go (UNSURE_KEPT_MAX)
        return position(message)  # a first delivery's id is where it was read

    def inherited(self, message: Message) -> bool:
        """Whether ``message`` lies in a range another process claimed before this one."""
        if h.origin(message.topic, message.headers) is not None:
            return False  # a copy: its id is its origin's, not where it was read
        return message.offset <= self._inherited_hi.get(message.tp, -1)

    async def wait_for_holders(self, tp: TopicPartition) -> bool:
        """Wait while a process that claimed ``tp`` before is alive and still claims it.

        True if one of them died with its claim: any message of its range may have been
        running when it died. The wait also ends when ``tp`` is revoked; the caller must then
        not run the message (the run guard numbers the assignments it sees).
        """
        pause_s = _WAIT_FIRST_S
        while self._holders.get(tp):
            try:
                alive, dead = await self._store.claiming(tp, self._holders[tp])
            except (rexc.RedisError, OSError) as exc:
                log.warning("parking unavailable, not waiting for %s's previous owner: %s", tp, exc)
                alive, dead = [], []
            if tp not in self._holders:  # revoked meanwhile
                break
            if dead:
                self._crashed.add(tp)
            self._holders[tp] = alive
            if not alive:
                break
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, _WAIT_MAX_S)
        return tp in self._crashed

    def seen_parked(self, key: str) -> bool:
        """Whether ``key`` (encoded) was parked when this member last saw it."""
        parked = self.maybe_parked
        return parked is not None and key in parked

    @contextlib.contextmanager
    def parking(self, key: str) -> Iterator[None]:
        """This member parks ``key`` in Redis inside the block (a failure or a deferral).

        On an ordered lane: the key is known as parked from the block's start on, and the
        parked keys are not read again (:meth:`forget_unparked`) until the call has returned.
        A call that raised (a cancellation) counts as failed (:meth:`unsure`).
        """
        self._maybe(key)
        self._parking += 1
        try:
            yield
        except BaseException:
            self.unsure(key)
            raise
        finally:
            self._parking -= 1

    def unsure(self, key: str) -> None:
        """A call of this member that parks ``key`` failed (a timeout, a lost connection).

        Redis may still run it later, after a reading of the parked keys, and the retry copy
        of the failed message may park it: the key is not forgotten by a reading for the lane's
        retry path (:attr:`_unsure_kept_s`), only once a later message of it is found not
        parked. A key with no later message (a flood of distinct keys failing during an outage)
        is forgotten by the first reading after that which does not find it parked. Past
        :data:`UNSURE_KEPT_MAX` such keys the oldest is let go, and every key taken for maybe
        parked until its retry path is over.
        """
        if self.maybe_parked is None:
            return
        self._maybe(key)
        unsure = self._unsure
        unsure.pop(key, None)  # the newest last: the oldest is let go first
        unsure[key] = time.monotonic()
        if len(unsure) <= UNSURE_KEPT_MAX:
            return
        oldest = next(iter(unsure))
        failed_s = unsure.pop(oldest)
        if self._all_maybe_until_s < time.monotonic():
            log.warning(
                "%s: over %d keys whose parking call got no answer; the oldest are let go, and"
                " first deliveries ask Redis whether their key is parked (no claimed path) for"
                " the lane's retry path: is Redis reachable?",
                self.topic,
                UNSURE_KEPT_MAX,
            )
        self._all_maybe_until_s = failed_s + self._unsure_bound_s()

    def _unsure_bound_s(self) -> float:
        """Seconds a failed parking call's key is kept: its retry path, UNSURE_KEPT_S at least."""
        return max(UNSURE_KEPT_S, self._unsure_kept_s)

    def decided(self, key: str, decision: str) -> None:
        """The exact path decided a message of ``key``: ``process`` means it is not parked."""
        if self.maybe_parked is None:
            return
        if decision == "process":
            self.maybe_parked.discard(key)
            self._unsure.pop(key, None)
        else:
            self._maybe(key)

    def _maybe(self, key: str) -> None:
        if self.maybe_parked is not None:
            self.maybe_parked.add(key)
            if self._parked_meanwhile is not None:
                self._parked_meanwhile.add(key)

    async def forget_unparked(self) -> None:
        """Keep only the keys Redis still has parked, once many more are remembered (the tick).

        A key is remembered from its parking until a later message of it is found not parked,
        so a key that has no later message (a conversation that ended on a failure) would be
        remembered for as long as the process lives: an outage that parked a million keys
        would keep them all. Past :data:`FORGET_PARKED_ABOVE` keys, and twice as many as the
        last reading found, the parked keys are read again (``HKEYS``) and the rest forgotten.
        Not while a call of this member that parks a key is under way (its key may reach Redis
        after the reading); keys learnt of during the reading, and the keys of parking calls
        that failed (:meth:`unsure`), are kept; a key parked in
        Redis is otherwise parked by the calls of this member before its next message can run
        here, or was parked already. On a Redis error the keys stay as they were. The key of a
        failed call is kept for the lane's retry path after the failure (at least
        :data:`UNSURE_KEPT_S`), then only if found.
        """
        known = self.maybe_parked
        if (
            known is None
            or len(known) <= self._forget_above
            or self._parking
            or self._parked_meanwhile is not None
        ):
            return
        self._parked_meanwhile = set()
        reading_s = time.monotonic()
        try:
            parked = await self._store.parked_keys()
        except (rexc.RedisError, OSError) as exc:
            log.warning(
                "parking unavailable, %s keep %d keys as maybe parked: %s",
                self.topic,
                len(known),
                exc,
            )
            return
        finally:
            meanwhile, self._parked_meanwhile = self._parked_meanwhile, None
        current = self.maybe_parked  # an assignment meanwhile may have replaced `known`
        assert current is not None  # noqa: S101 - once loaded, never None again
        kept_s = self._unsure_bound_s()
        self._unsure = {
            key: failed_s for key, failed_s in self._unsure.items() if reading_s - failed_s < kept_s
        }
        kept = parked | meanwhile | self._unsure.keys()
        log.info(
            "%s: %d keys no longer parked forgotten, %d kept",
            self.topic,
            len(current - kept),
            len(kept),
        )
        self.maybe_parked = kept
        self._forget_above = max(FORGET_PARKED_ABOVE, 2 * len(kept))
