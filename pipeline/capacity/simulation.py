"""A discrete-event simulation of one lane's members under a scaling policy.

Messages arrive as a Poisson process whose rate is constant within each minute (the rate curve,
arrivals per second per minute), each holds one handler slot for an exponential service time,
and waits FIFO in one queue for a free slot of a *ready* member. Every ``tick_s`` (KEDA's
polling interval) a :class:`Policy` sees the lane and names the members it wants; the scaler
applies it the way a HorizontalPodAutoscaler does: up at once (at most doubling, or four more),
down only to the highest wish of the stabilisation window and one member per ``down_every_s``.
A new member serves only after ``startup_s``; a removed one stops taking work at once (its
running messages finish). Slot-hours count every member from its creation to its removal,
starting or not: that is what the cluster pays for.

Pure Python and seeded: the same inputs give the same :class:`Outcome`.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Fleet", "Observation", "Outcome", "Policy", "simulate"]


@dataclass(frozen=True, slots=True)
class Fleet:
    """How the lane's members behave and how the autoscaler moves them.

    Attributes:
        slots_per_member: handler slots of one member.
        service_s: mean service time of one message (exponential).
        startup_s: seconds from a scale-up decision until the new member serves.
        tick_s: seconds between autoscaler decisions.
        stabilisation_s: scale-down uses the highest wish of this many past seconds.
        down_every_s: at most one member removed per this many seconds.
        min_members: the floor.
        max_members: the ceiling (the lane's partitions).
    """

    slots_per_member: int = 16
    service_s: float = 20.0
    startup_s: float = 300.0
    tick_s: float = 15.0
    stabilisation_s: float = 600.0
    down_every_s: float = 120.0
    min_members: int = 1
    max_members: int = 64


@dataclass(frozen=True, slots=True)
class Observation:
    """What a policy sees at a tick.

    Attributes:
        now_s: seconds since the start of the simulation.
        queued: messages waiting for a slot.
        busy: slots running a message.
        members: members that exist (ready or starting).
        ready: members serving.
        minute_counts: arrivals in each whole minute so far (the recorded history).
    """

    now_s: float
    queued: int
    busy: int
    members: int
    ready: int
    minute_counts: Sequence[int]


class Policy(Protocol):
    """A scaling policy: how many members the lane should have now."""

    name: str

    def desired(self, seen: Observation, fleet: Fleet) -> int:
        """The member count this policy asks for (before the autoscaler's limits)."""
        ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a policy cost over the simulated span.

    Attributes:
        policy: the policy's name.
        messages: messages that started service.
        mean_wait_s: mean wait for a slot.
        p99_wait_s: 99th percentile of the wait for a slot.
        max_wait_s: the longest wait.
        slot_hours: slots paid for (members x slots x hours, starting members included).
        peak_members: the most members at once.
    """

    policy: str
    messages: int
    mean_wait_s: float
    p99_wait_s: float
    max_wait_s: float
    slot_hours: float
    peak_members: int


def simulate(
    rates_per_s: Sequence[float],
    policy: Policy,
    fleet: Fleet,
    *,
    seed: int = 1,
    initial_members: int | None = None,
) -> Outcome:
    """Run the lane for ``len(rates_per_s)`` minutes under ``policy`` and measure it."""
    rng = random.Random(seed)
    lane = _Lane(fleet, rng, len(rates_per_s), initial_members or fleet.min_members)
    end_s = 60.0 * len(rates_per_s)
    next_tick = fleet.tick_s
    arrival = _next_arrival(rng, rates_per_s, 0.0)
    while True:
        finish = lane.finishes[0] if lane.finishes else math.inf
        ready = lane.starting[0] if lane.starting else math.inf
        t = min(arrival, finish, ready, next_tick)
        if t >= end_s:
            break
        if t == arrival:
            lane.arrive(t)
            arrival = _next_arrival(rng, rates_per_s, t)
        elif t == finish:
            lane.finish(t)
        elif t == ready:
            lane.member_ready(t)
        else:
            lane.tick(t, policy)
            next_tick = t + fleet.tick_s
    return _outcome(policy.name, lane.waits, lane.slot_s, lane.peak)


class _Lane:
    """The simulated lane's state: the queue, the busy slots, the members and the scaler."""

    def __init__(self, fleet: Fleet, rng: random.Random, minutes: int, members: int) -> None:
        self.fleet = fleet
        self.rng = rng
        self.members = members
        self.ready = members
        self.starting: deque[float] = deque()  # ready times of members still starting
        self.wishes: deque[tuple[float, int]] = deque()
        self.last_down_s = -math.inf
        self.finishes: list[float] = []
        self.queue: deque[float] = deque()
        self.waits: list[float] = []
        self.counts = [0] * minutes
        self.slot_s = 0.0
        self.peak = members

    @property
    def capacity(self) -> int:
        return self.ready * self.fleet.slots_per_member

    def _start(self, now: float, arrived: float) -> None:
        self.waits.append(now - arrived)
        heapq.heappush(self.finishes, now + self.rng.expovariate(1.0 / self.fleet.service_s))

    def _drain(self, now: float) -> None:
        while self.queue and len(self.finishes) < self.capacity:
            self._start(now, self.queue.popleft())

    def arrive(self, now: float) -> None:
        self.counts[int(now // 60.0)] += 1
        if not self.queue and len(self.finishes) < self.capacity:
            self._start(now, now)
        else:
            self.queue.append(now)

    def finish(self, now: float) -> None:
        heapq.heappop(self.finishes)
        self._drain(now)

    def member_ready(self, now: float) -> None:
        self.starting.popleft()
        self.ready += 1
        self._drain(now)

    def tick(self, now: float, policy: Policy) -> None:
        fleet = self.fleet
        self.slot_s += self.members * fleet.slots_per_member * fleet.tick_s
        seen = Observation(
            now,
            len(self.queue),
            len(self.finishes),
            self.members,
            self.ready,
            self.counts[: int(now // 60)],
        )
        wish = min(max(policy.desired(seen, fleet), fleet.min_members), fleet.max_members)
        self.wishes.append((now, wish))
        while self.wishes[0][0] < now - fleet.stabilisation_s:
            self.wishes.popleft()
        if wish > self.members:
            target = min(wish, max(2 * self.members, self.members + 4))
            self.starting.extend([now + fleet.startup_s] * (target - self.members))
            self.members = target
        elif (
            now - self.last_down_s >= fleet.down_every_s
            and max(w for _, w in self.wishes) < self.members
        ):
            self.members -= 1
            self.last_down_s = now
            if self.starting:
                self.starting.pop()  # cancel the member that would have started last
            else:
                self.ready -= 1
        self.peak = max(self.peak, self.members)


def _next_arrival(rng: random.Random, rates_per_s: Sequence[float], now: float) -> float:
    # Piecewise-constant rate per minute: an exponential gap that crosses the minute's end is
    # drawn again from the boundary at the next minute's rate (exact, by memorylessness).
    minute = int(now // 60.0)
    while minute < len(rates_per_s):
        rate = rates_per_s[minute]
        boundary = 60.0 * (minute + 1)
        if rate > 0:
            candidate = now + rng.expovariate(rate)
            if candidate < boundary:
                return candidate
        now = boundary
        minute += 1
    return math.inf


def _outcome(name: str, waits: list[float], slot_s: float, peak: int) -> Outcome:
    if not waits:
        return Outcome(name, 0, 0.0, 0.0, 0.0, slot_s / 3600.0, peak)
    ordered = sorted(waits)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return Outcome(
        name, len(ordered), sum(ordered) / len(ordered), p99, ordered[-1], slot_s / 3600.0, peak
    )
