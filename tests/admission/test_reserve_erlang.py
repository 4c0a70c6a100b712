"""Erlang C and the reserve it sizes for pools whose small tenants offer hundreds of Erlangs."""

from __future__ import annotations

from fractions import Fraction

import pytest

from pipeline.admission.reserve import TARGET, erlang_c, reserve_slots


def _exact_erlang_c(servers: int, offered: int) -> float:
    """Erlang C in exact rationals: A^c/c! · c/(c-A) over the sum below plus that term."""
    term, below = Fraction(1), Fraction(0)
    for k in range(servers):
        below += term
        term *= Fraction(offered, k + 1)
    waiting = term * Fraction(servers, servers - offered)
    return float(waiting / (below + waiting))


@pytest.mark.parametrize(("servers", "offered"), [(801, 800), (850, 800), (1300, 1200)])
def test_erlang_c_holds_for_loads_whose_terms_overflow_a_float(servers: int, offered: int):
    """Past about 710 Erlangs A^k/k! overflows a float; the probability must still be right."""
    assert erlang_c(servers, float(offered)) == pytest.approx(_exact_erlang_c(servers, offered))


def test_the_reserve_for_800_erlangs_keeps_the_wait_under_the_target():
    """100 small jobs/s of 8 s need the least c whose exact P(wait) is under 1 %, not 801."""
    slots = reserve_slots(100, 8.0)
    assert _exact_erlang_c(slots, 800) < TARGET <= _exact_erlang_c(slots - 1, 800)
