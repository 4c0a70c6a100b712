"""How many slots to keep back for tenants under their floor, and how much of it to lend.

A pool shared by steady small tenants and a flooder is non-preemptive: a small tenant's job that
finds every slot taken waits for some job to finish. Two sizes follow from the small tenants'
measured arrival rate ``λ`` and service time ``D`` (offered load ``A = λ·D`` Erlangs, Little's
law, as the floors of :mod:`pipeline.admission.limits`):

- the **reserve**: the slots the small tenants would need to themselves so that a job waits with
  probability below ``target`` (1 %). That is the M/M/c price of waiting, Erlang C::

      C(c, A) = (A^c / c!) · c/(c - A)  /  (Σ_{k<c} A^k / k!  +  (A^c / c!) · c/(c - A))

  and the reserve is the least ``c`` with ``C(c, A) < target``.
- the **headroom**: the part of the reserve that is never lent. The rest is lent to the flooder
  (lower priority) whenever the small tenants do not use it, but lent work only comes back
  when it finishes. Kept at ``h`` idle slots, the pool's free slots fall by one at each small
  arrival (rate ``λ``) and come back at each completion of any job: with ``f`` slots free,
  ``slots - f`` jobs hold the others, so a slot frees at rate ``(slots - f) / D_pool``
  (``D_pool`` the mean time a job holds its pool slot, known per lane); below ``h`` the flooder
  takes nothing. That is a birth-death chain on ``f = 0..h`` whose balance gives::

      π(f) = π(f + 1) · λ·D_pool / (slots - f)

  A small job that finds no slot free waits in the key's queue, and the next release goes to
  it, so the pool stays full until the queue is empty: at ``f = 0`` the queue grows at ``λ``
  and shrinks at ``slots / D_pool``, and the full pool's share of the time is
  ``π(0) / (1 - u)`` with ``u = λ·D_pool / slots`` (the pool's utilisation by small jobs). A
  small arrival sees the time average and waits while the pool is full::

      P(wait) = (π(0) / (1 - u)) / (Σ_{f ≥ 1} π(f) + π(0) / (1 - u))

  The headroom is the least ``h`` with ``P(wait) < target``: lent work is expected back before
  a small job needs it, in all but ``target`` of arrivals. At the benchmark's load (16 slots,
  4 Erlangs) ``h = 4`` gives 0.55 %; the chain without the queue said 0.41 %, and counting
  every slot as busy in every state (completions always at ``slots / D_pool``) 0.29 %.

No way of lending does better than that chain. Across the cut between ``f - 1`` and ``f``
free slots the pool moves up only when one of the ``slots - f + 1`` held slots frees (from a
full pool, only once no small job waits) and down at least at each small arrival (lending only
adds to that), so in any steady state ``π(f) · λ ≤ π(f - 1) · (slots - f + 1) / D_pool``, with
the full pool's time less its queue's, ``P(wait) · (1 - u)``, in place of ``π(0)``. With
``P(wait)`` at most ``target``, those caps put a floor under the mean number of idle slots
(:func:`least_idle_slots`, which the headroom chain meets), and so a ceiling on the share of
what the small tenants leave that a flooder can use (:func:`lendable_share`): for 16 slots and
4 Erlangs, at least 3.25 slots idle on average and a share of at most 0.73, whatever the
policy, short of preempting running work.

The throttle enforces the lending as trunk reservation on the pool key
(:meth:`~pipeline.admission.throttle.Throttle.set_reserve`): permits below the small tenants'
priority see the pool's limit minus the headroom, so they borrow whatever else is free.
:class:`ReserveSizer` re-sizes it as the measured rates change.

These are pure functions of the rates; ``tests/admission/test_reserve.py`` checks them against
hand-computed values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

TARGET = 0.01
"""Default bound on the probability that a small tenant's job waits for a slot."""


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/``servers`` queue with ``offered`` Erlangs.

    1.0 when the servers cannot keep up (``offered >= servers``); 0.0 when nothing is offered.
    """
    if servers <= 0:
        return 1.0
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    # Erlang B by its recursion, then C from B: the terms A^k / k! themselves overflow a float
    # past about 710 Erlangs (and the quotient of two infinities is NaN).
    blocked = 1.0
    for k in range(1, servers + 1):
        blocked = offered * blocked / (k + offered * blocked)
    return servers * blocked / (servers - offered * (1.0 - blocked))


def reserve_slots(arrival_per_s: float, service_s: float, target: float = TARGET) -> int:
    """The least ``c`` with ``erlang_c(c, λ·D) < target`` (0 when nothing arrives)."""
    offered = max(arrival_per_s, 0.0) * max(service_s, 0.0)
    if offered <= 0:
        return 0
    servers = max(1, math.floor(offered) + 1)
    while erlang_c(servers, offered) >= target:
        servers += 1
    return servers


def wait_probability(
    headroom: int, arrival_per_s: float, slots: int, pool_service_s: float
) -> float:
    """The share of small arrivals that find the pool full, with ``headroom`` slots kept idle.

    With ``f`` of the pool's ``slots`` free, a small arrival takes one at rate ``λ`` and one of
    the ``slots - f`` held frees at rate ``(slots - f) / pool_service_s`` (the mean hold time);
    once none is free, small arrivals queue and each release serves one, so the pool stays full
    ``1 / (1 - λ·D_pool / slots)`` times as long as the chain's ``π(0)``. ``headroom`` is capped
    at ``slots``; 1.0 when the pool cannot keep up with the small arrivals alone.
    """
    if arrival_per_s <= 0:
        return 0.0
    if pool_service_s <= 0 or slots <= 0:
        return 1.0
    offered = arrival_per_s * pool_service_s
    if offered >= slots:
        return 1.0
    state, total = 1.0, 1.0  # π(h) = 1, then π(h - 1), ..., π(0)
    for free in range(min(headroom, slots) - 1, -1, -1):
        state *= offered / (slots - free)
        total += state
    full = state / (1.0 - offered / slots)  # π(0) and the queue's states behind it
    return full / (total - state + full)


def headroom_slots(
    arrival_per_s: float, slots: int, pool_service_s: float, target: float = TARGET
) -> int:
    """The least ``h`` (at most ``slots``) with ``wait_probability(h, ...) < target``."""
    for headroom in range(slots + 1):
        if wait_probability(headroom, arrival_per_s, slots, pool_service_s) < target:
            return headroom
    return slots


def least_idle_slots(
    arrival_per_s: float, slots: int, pool_service_s: float, target: float = TARGET
) -> float:
    """The fewest idle slots on average any non-preemptive pool can keep with ``P(wait) ≤ target``.

    Whatever decides when to lend, ``π(f) ≤ π(f - 1) · (slots - f + 1) / (λ·D_pool)`` (the flow
    across the cut between ``f - 1`` and ``f`` free slots), where for ``f = 1`` the full pool
    counts only while no small job waits: ``P(wait) · (1 - λ·D_pool / slots)``. The least mean
    puts ``P(wait) = target`` and then as much probability as those caps allow on the fewest
    free slots. ``slots`` when even all of them idle cannot meet ``target``.
    """
    if arrival_per_s <= 0:
        return 0.0
    if pool_service_s <= 0 or slots <= 0:
        return float(max(slots, 0))
    offered = arrival_per_s * pool_service_s
    if offered >= slots:
        return float(slots)
    cap, left, mean = target * (1.0 - offered / slots), 1.0 - target, 0.0
    for free in range(1, slots + 1):
        cap *= (slots - free + 1) / offered
        taken = min(cap, left)
        mean += free * taken
        left -= taken
        if left <= 0:
            return mean
    return float(slots)


def lendable_share(
    arrival_per_s: float, slots: int, pool_service_s: float, target: float = TARGET
) -> float:
    """The most of the room small tenants leave (``slots - λ·D_pool``) a flooder can fill.

    ``1 - least_idle_slots(...) / (slots - λ·D_pool)`` for jobs that hold a slot as long as the
    small tenants' do; 0.0 when the small tenants leave no room.
    """
    room = slots - max(arrival_per_s, 0.0) * max(pool_service_s, 0.0)
    if room <= 0:
        return 0.0
    idle = least_idle_slots(arrival_per_s, slots, pool_service_s, target)
    return max(0.0, 1.0 - idle / room)


def lendable(reserve: int, in_use: int, headroom: int) -> int:
    """Slots of the reserve the flooder may borrow now: unused, less the headroom kept idle."""
    return max(0, reserve - in_use - headroom)


@dataclass(frozen=True, slots=True)
class ReservePlan:
    """The sizes for one set of measured rates.

    Attributes:
        reserve: slots the small tenants need to themselves for ``P(wait) < target`` (Erlang C).
        headroom: slots of it never lent (the flooder's room on the pool is ``slots - headroom``
            minus whatever the small tenants hold).
        offered: the small tenants' offered load, ``λ·D`` Erlangs.
        wait_probability: ``P(wait)`` of a small job with that headroom.
    """

    reserve: int
    headroom: int
    offered: float
    wait_probability: float


def plan(
    slots: int,
    arrival_per_s: float,
    service_s: float,
    pool_service_s: float,
    target: float = TARGET,
) -> ReservePlan:
    """Size the reserve and its headroom for a pool of ``slots``.

    Args:
        slots: the pool's limit.
        arrival_per_s: the small tenants' measured arrival rate.
        service_s: their measured mean service time.
        pool_service_s: the mean time a job of the pool (any lane) holds its slot: with ``f``
            slots free, slots come back at ``(slots - f) / pool_service_s`` a second.
        target: the bound on ``P(wait)``.
    """
    reserve = min(slots, reserve_slots(arrival_per_s, service_s, target))
    headroom = min(reserve, headroom_slots(arrival_per_s, slots, pool_service_s, target))
    return ReservePlan(
        reserve=reserve,
        headroom=headroom,
        offered=max(arrival_per_s, 0.0) * max(service_s, 0.0),
        wait_probability=wait_probability(headroom, arrival_per_s, slots, pool_service_s),
    )


class ReserveSetter(Protocol):
    """What :class:`ReserveSizer` needs of the throttle."""

    async def set_reserve(self, key: str, slots: int | None, min_priority: int = 0) -> None:
        """Keep the last ``slots`` of ``key`` for permits of ``min_priority`` or more."""


class ReserveSizer:
    """Keeps a pool key's reserve sized to the measured rates; call :meth:`resize` periodically."""

    def __init__(
        self,
        throttle: ReserveSetter,
        key: str,
        slots: int,
        min_priority: int,
        target: float = TARGET,
    ) -> None:
        """Size the reserve of ``key`` (limit ``slots``) for permits of ``min_priority`` up."""
        self._throttle = throttle
        self._key = key
        self._slots = slots
        self._min_priority = min_priority
        self._target = target
        self.current: ReservePlan | None = None

    async def resize(
        self, arrival_per_s: float, service_s: float, pool_service_s: float
    ) -> ReservePlan:
        """Recompute from the rates and set the headroom on the throttle (one call).

        It is set at every resize, changed or not: told only of changes, a Redis that lost its
        state (a restart without persistence, a flush) kept no reserve for as long as the
        rates held steady, and the small tenants' slots went to the flooder.
        """
        sized = plan(self._slots, arrival_per_s, service_s, pool_service_s, self._target)
        await self._throttle.set_reserve(self._key, sized.headroom, self._min_priority)
        self.current = sized
        return sized
