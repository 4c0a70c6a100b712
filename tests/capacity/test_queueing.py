"""Little's law sizing and the M/M/c (Erlang C) wait."""

from __future__ import annotations

import math

import pytest

from pipeline.capacity.queueing import (
    backlog_members,
    busy_slots,
    erlang_c,
    mean_wait_s,
    members_for,
    slots_for_wait,
)


@pytest.mark.parametrize("rho", [0.5, 0.7, 0.8, 0.9, 0.95])
def test_one_slot_waits_rho_over_one_minus_rho_task_lengths(rho: float) -> None:
    """With one slot the M/M/c wait reduces to seed 003's rho / (1 - rho) task lengths."""
    assert mean_wait_s(rho, 1.0, 1) == pytest.approx(rho / (1 - rho))


def test_four_slots_at_eighty_percent_wait_as_the_seed_measured() -> None:
    """One queue feeding four slots 80 % busy waits about 0.74 task lengths (seed 003)."""
    assert mean_wait_s(3.2, 1.0, 4) == pytest.approx(0.74, abs=0.01)


def test_saturated_slots_wait_without_bound() -> None:
    """Arrivals at or past the slots' capacity have no steady wait and always queue."""
    assert math.isinf(mean_wait_s(10.0, 1.0, 10))
    assert erlang_c(10, 12.0) == 1.0


def test_members_follow_littles_law_with_headroom() -> None:
    """231 jobs/s of 2 s at 70 % busy needs 662 slots: 34 members of 20 (seed 003's estimate)."""
    assert busy_slots(231.48, 2.0) == pytest.approx(463, abs=0.1)
    assert members_for(231.48, 2.0, 20, target_utilisation=0.7) == 34
    assert members_for(0.0, 2.0, 20, floor=2) == 2


def test_slots_for_wait_is_the_fewest_that_meet_the_target() -> None:
    """The slot count returned meets the target wait and one fewer does not."""
    slots = slots_for_wait(8.0, 0.5, 0.05)
    assert mean_wait_s(8.0, 0.5, slots) <= 0.05 < mean_wait_s(8.0, 0.5, slots - 1)


def test_a_queue_within_one_members_slots_asks_for_nothing_more() -> None:
    """Up to one member's slots of waiting messages come and go; they add no member."""
    assert backlog_members(0, 20.0, 16, drain_s=300.0) == 0
    assert backlog_members(16, 20.0, 16, drain_s=300.0) == 0


def test_a_backlog_beyond_one_member_gets_the_members_to_drain_it() -> None:
    """The excess, times the service time, is drained by enough slots within drain_s."""
    assert backlog_members(17, 20.0, 16, drain_s=300.0) == 1
    # 16 + 480 waiting: 480 x 20 s = 9,600 slot-seconds, 32 slots for 300 s: two members
    assert backlog_members(16 + 480, 20.0, 16, drain_s=300.0) == 2
    assert backlog_members(16 + 481, 20.0, 16, drain_s=300.0) == 3


def _independent_mean_wait_s(rate_per_s: float, service_s: float, servers: int) -> float:
    """M/M/c mean wait from Erlang C's own sums, in logs (A^k/k! overflows a float otherwise).

    Terms further than 60 standard deviations below the load are below e^-1800 of the largest
    and are left out.
    """
    offered = rate_per_s * service_s
    first = max(0, int(offered - 60 * math.sqrt(offered)))

    def log_term(k: int) -> float:
        return k * math.log(offered) - math.lgamma(k + 1)

    top = log_term(servers)
    below = math.fsum(math.exp(log_term(k) - top) for k in range(first, servers))
    waiting = servers / (servers - offered)
    return waiting / (below + waiting) * service_s / (servers - offered)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("rate_per_s", "service_s", "target_wait_s"),
    [(8.0, 0.5, 0.05), (4e4, 10.0, 0.01), (1e5, 10.0, 1.0)],
)
def test_slots_for_wait_meets_the_target_for_huge_loads(
    rate_per_s: float, service_s: float, target_wait_s: float
) -> None:
    """From 4 to a million busy slots, the slots returned meet the target and one fewer does not."""
    slots = slots_for_wait(rate_per_s, service_s, target_wait_s)
    assert _independent_mean_wait_s(rate_per_s, service_s, slots) <= target_wait_s
    assert _independent_mean_wait_s(rate_per_s, service_s, slots - 1) > target_wait_s


@pytest.mark.timeout(30)
def test_the_wait_of_a_huge_slot_count_is_computed_at_once() -> None:
    """A trillion slots (pipeline capacity --members with a typo) wait 0 s; no hang."""
    assert erlang_c(10**12, 1.0) == 0.0
    assert mean_wait_s(10.0, 0.1, 10**12) == 0.0
    assert mean_wait_s(3.2, 1.0, 4) == pytest.approx(0.74, abs=0.01)
