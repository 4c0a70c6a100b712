"""Queueing arithmetic for sizing a lane: Little's law and the M/M/c (Erlang C) wait.

Little's law (``L = λ·W``, seed 003) says a lane receiving ``rate_per_s`` messages a second that
each hold a handler slot for ``service_s`` seconds keeps ``rate_per_s * service_s`` slots busy on
average, whatever the number of members. How long a message then *waits* for a slot depends on
how busy the slots are: for random arrivals and random service times with ``c`` slots behind one
queue (M/M/c) the probability of waiting at all is Erlang's C formula, and the mean wait is
``C / (c·μ - λ)``; with ``c = 1`` this is seed 003's ``rho / (1 - rho)`` task lengths.

All functions are pure; rates are per second, times in seconds. A rate, service time or load
that is NaN or infinite is no load: ValueError (the slot searches would never end).
"""

from __future__ import annotations

import math

__all__ = [
    "backlog_members",
    "busy_slots",
    "erlang_c",
    "mean_wait_s",
    "members_for",
    "slots_for_wait",
]


def busy_slots(rate_per_s: float, service_s: float) -> float:
    """Little's law: slots busy on average (``λ · s``), in slots."""
    return max(_finite(rate_per_s, "rate_per_s"), 0.0) * max(_finite(service_s, "service_s"), 0.0)


def _finite(value: float, name: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, not {value!r}")
    return value


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits, for ``servers`` slots and ``offered = λ·s`` Erlangs.

    Computed through the Erlang B recursion, which stays stable for thousands of servers.
    Returns 1.0 when the load is at or past the servers' capacity (the queue never drains).
    Once the blocking probability falls below the smallest float it stays 0 for every further
    server, so a huge ``servers`` costs about as much as the load, not as the servers.
    """
    if servers <= 0 or _finite(offered, "offered") >= servers:
        return 1.0
    if offered <= 0:
        return 0.0
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered * blocking / (k + offered * blocking)
        if blocking == 0.0:
            return 0.0
    utilisation = offered / servers
    return blocking / (1 - utilisation * (1 - blocking))


def mean_wait_s(rate_per_s: float, service_s: float, servers: int) -> float:
    """Mean time a message waits for a slot in M/M/c (``inf`` when ``λ·s >= c``)."""
    offered = busy_slots(rate_per_s, service_s)
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return math.inf
    return erlang_c(servers, offered) * service_s / (servers - offered)


def slots_for_wait(rate_per_s: float, service_s: float, target_wait_s: float) -> int:
    """The fewest slots whose M/M/c mean wait is at most ``target_wait_s`` (at least 1).

    One pass of the Erlang B recursion gives the blocking probability of each slot count in
    turn, so the search costs as much as one :func:`erlang_c` at the answer, however far above
    the load the answer lies.
    """
    offered = busy_slots(rate_per_s, service_s)
    if offered <= 0:
        return 1
    target = max(target_wait_s, 0.0)
    blocking, servers = 1.0, 0
    while True:
        servers += 1
        blocking = offered * blocking / (servers + offered * blocking)
        if servers > offered:
            waits = blocking / (1 - offered / servers * (1 - blocking))
            if waits * service_s / (servers - offered) <= target:
                return servers


def members_for(
    rate_per_s: float,
    service_s: float,
    slots_per_member: int,
    *,
    target_utilisation: float = 0.7,
    floor: int = 1,
) -> int:
    """Members a lane needs: ``max(floor, ceil(λ·s / (slots · target)))`` (seed 000's base).

    The target utilisation is the headroom: seed 003 plans pools for about 70 % busy at peak,
    because the last 20 % of "spare" slots is what keeps the line short.
    """
    capacity = max(slots_per_member, 1) * min(max(target_utilisation, 0.01), 1.0)
    return max(floor, math.ceil(busy_slots(rate_per_s, service_s) / capacity - 1e-9))


def backlog_members(
    waiting: float, service_s: float, slots_per_member: int, *, drain_s: float
) -> int:
    """Members to add to the busy-slot count so that a backlog drains within ``drain_s``.

    A queue shorter than one member's slots is allowed for (short queues come and go with
    Poisson arrivals); the rest, ``(waiting - slots) · s`` slot-seconds of work, gets the slots
    to finish within ``drain_s`` (a member's start-up): ``ceil((waiting - slots) · s /
    (slots · drain_s))``, so a backlog beyond one member's slots asks for at least one more.
    The lane's slot trigger adds it in PromQL (:mod:`pipeline.capacity.triggers`).
    """
    slots = max(slots_per_member, 1)
    excess = waiting - slots
    if excess <= 0:
        return 0
    return math.ceil(excess * max(service_s, 0.0) / (slots * max(drain_s, 1e-9)) - 1e-9)
