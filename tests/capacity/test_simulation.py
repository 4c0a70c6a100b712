"""The scaling simulation agrees with M/M/c theory and charges each policy its slot-hours."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipeline.capacity.policies import LagPolicy, PredictivePolicy, UtilisationPolicy
from pipeline.capacity.queueing import mean_wait_s
from pipeline.capacity.simulation import Fleet, Observation, simulate


@dataclass(frozen=True)
class Fixed:
    """A policy that always asks for the same members (no scaling)."""

    members: int
    name: str = "fixed"

    def desired(self, seen: Observation, fleet: Fleet) -> int:  # noqa: ARG002 - the protocol
        """The fixed count."""
        return self.members


@pytest.mark.parametrize("rho", [0.5, 0.8, 0.9])
def test_steady_state_mean_wait_is_within_ten_percent_of_mm_c(rho: float) -> None:
    """Four slots at a fixed utilisation wait, on average, what Erlang C predicts (within 10 %)."""
    fleet = Fleet(slots_per_member=4, service_s=1.0, min_members=1, max_members=1)
    rate = rho * 4 / fleet.service_s
    minutes = round(400_000 / (rate * 60))
    outcome = simulate([rate] * minutes, Fixed(1), fleet, seed=11)
    theory = mean_wait_s(rate, fleet.service_s, 4)
    assert outcome.mean_wait_s == pytest.approx(theory, rel=0.10)


def test_slot_hours_count_every_member_for_the_whole_span() -> None:
    """Two members of 16 slots held for one hour cost 32 slot-hours, idle or not."""
    fleet = Fleet(min_members=2, max_members=2)
    outcome = simulate([0.5] * 60, Fixed(2), fleet, seed=1)
    assert outcome.slot_hours == pytest.approx(32.0, rel=0.01)
    assert outcome.peak_members == 2


def test_a_reactive_policy_scales_out_only_after_its_signal_and_start_up() -> None:
    """A step from idle to 4/s queues messages while new members start, then drains."""
    fleet = Fleet(startup_s=300.0)
    rates = [0.1] * 30 + [4.0] * 90
    lag = simulate(rates, LagPolicy(16.0), fleet, seed=2)
    util = simulate(rates, UtilisationPolicy(0.7), fleet, seed=2)
    assert lag.max_wait_s > fleet.startup_s / 2
    assert util.peak_members >= 8  # 4/s x 20 s = 80 busy slots at 70 % of 16
    assert lag.messages == util.messages


def test_the_predictive_policy_adds_the_backlogs_members_to_the_busy_slots() -> None:
    """Saturated, it asks for the utilisation wish plus a member once a backlog passes 16."""
    fleet = Fleet()
    quiet = [0] * 60  # no history: the forecast asks for the floor only
    policy = PredictivePolicy(quiet, target=0.85, reactive_target=0.85)
    plain = PredictivePolicy(quiet, target=0.85, reactive_target=0.85, drain_s=None)

    def seen(queued: int) -> Observation:
        return Observation(3600.0, queued, 64, 4, 4, [0] * 60)

    assert policy.desired(seen(16), fleet) == plain.desired(seen(16), fleet) == 5  # 64 / 13.6
    assert policy.desired(seen(17), fleet) == 6
    assert plain.desired(seen(500), fleet) == 5  # busy slots alone never see the queue
    assert policy.desired(seen(16 + 481), fleet) == 5 + 3
