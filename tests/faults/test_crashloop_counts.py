"""How the crash-loop scenario counts overlapping runs and order violations from its records."""

from __future__ import annotations

from faults.crashloop import Ends, Span, find_overlaps, order_examples, order_violations


def _span(token: str, event: str, enter: int, where: str = "lane:0:1") -> Span:
    return Span(token, "k1", event, 1, where, enter)


def test_a_run_entering_before_another_left_overlaps() -> None:
    """An entry between another run's entry and exit of the same key is one overlap."""
    spans = [_span("10.a.0", "e1", 1), _span("11.b.0", "e2", 2), _span("11.b.1", "e3", 4)]
    found = find_overlaps(spans, Ends({"10.a.0": 3, "11.b.0": 5, "11.b.1": 6}, {}, {10, 11}))
    assert (found.certain, found.uncertain, found.same_member) == (2, 0, 1)
    assert found.kinds == {"first run": 2}


def test_runs_one_after_the_other_do_not_overlap() -> None:
    """Runs of one key that each left before the next entered are no overlap."""
    spans = [_span("10.a.0", "e1", 1), _span("10.a.1", "e2", 3)]
    found = find_overlaps(spans, Ends({"10.a.0": 2, "10.a.1": 4}, {}, {10}))
    assert (found.certain, found.uncertain) == (0, 0)


def test_a_killed_run_runs_until_its_kill_was_sent() -> None:
    """A run killed mid-way overlaps entries before the kill, maybe those until it was reaped."""
    killed = {10: (5, 8)}
    for enter, certain, uncertain in [(4, 1, 0), (6, 0, 1), (9, 0, 0)]:
        spans = [_span("10.a.0", "e1", 1), _span("11.b.0", "e1", enter)]
        found = find_overlaps(spans, Ends({"11.b.0": enter + 1}, killed, {11}))
        assert (found.certain, found.uncertain) == (certain, uncertain), enter


def test_a_run_of_a_crashed_member_may_overlap_anything_after_it() -> None:
    """A run whose member exited unkilled has no known end: later entries are uncertain."""
    spans = [_span("10.a.0", "e1", 1), _span("11.b.0", "e2", 50)]
    found = find_overlaps(spans, Ends({"11.b.0": 51}, {}, {11}))
    assert (found.certain, found.uncertain) == (0, 1)


def test_only_a_run_in_its_handler_when_its_process_froze_may_be_overlapped() -> None:
    """Frozen from 5 to 9: its run from 3 met by one at 6 is apart; its run from 10 is not."""
    frozen = {10: [(5, 9)]}
    spans = [_span("10.a.0", "e1", 3), _span("11.b.0", "e2", 6)]
    found = find_overlaps(spans, Ends({"10.a.0": 12, "11.b.0": 7}, {}, {10, 11}, frozen))
    assert (found.certain, found.in_flight_when_frozen) == (0, 1)
    spans = [_span("11.b.0", "e2", 6), _span("10.a.1", "e3", 10), _span("11.b.1", "e4", 11)]
    found = find_overlaps(
        spans, Ends({"11.b.0": 7, "10.a.1": 13, "11.b.1": 12}, {}, {10, 11}, frozen)
    )
    assert (found.certain, found.in_flight_when_frozen) == (1, 0)


def test_a_stale_copy_of_a_finished_event_is_named_so() -> None:
    """The run found running is named a stale copy when its event had finished before."""
    spans = [
        _span("10.a.0", "e1", 1),
        _span("10.a.1", "e1", 3, "lane.retry.1s:0:7"),
        _span("11.b.0", "e2", 4),
    ]
    ends = Ends({"10.a.0": 2, "10.a.1": 6, "11.b.0": 5}, {}, {10, 11})
    found = find_overlaps(spans, ends)
    assert found.kinds == {"stale copy from a retry tier": 1}
    assert "e2" in found.examples[0]


def test_order_violations_count_first_successes_behind_a_later_event() -> None:
    """Per key, each first success of an event produced before one already applied counts."""
    order = {"k1": [(1, 0, 1), (3, 0, 3), (2, 0, 2), (4, 0, 4)], "k2": [(5, 0, 1), (6, 0, 2)]}
    assert order_violations(order) == 1


def test_an_order_violation_is_shown_with_its_keys_runs() -> None:
    """The failure names the key out of order, the order its effects ran in, and its runs."""
    order = {"k1": [(1, 0, 1), (3, 0, 3), (2, 0, 2)], "k2": [(5, 0, 1), (6, 0, 2)]}
    spans = [Span("10.a.0", "k1", "e2", 1, "t:0:2", 4), Span("11.b.0", "k2", "e5", 1, "t:0:1", 1)]
    lines = order_examples(order, spans, Ends({"10.a.0": 7}, {}, {10, 11}))
    assert lines == ["key k1 applied: 1@0:1 3@0:3 2@0:2", "key k1 runs: 4..7 10.a.0 e2 a1 t:0:2"]
