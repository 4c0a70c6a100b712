"""Repeated warnings are logged with backoff and a count of what was held back."""

from __future__ import annotations

import logging

from pipeline.log_repeats import (
    FIRST_GAP_S,
    JUDGED,
    MAX_GAP_S,
    MAX_KEPT,
    REPEAT_KEY,
    RepeatFilter,
    configure_logging,
    error_text,
)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        """Start at zero."""
        self.now_s = 0.0

    def __call__(self) -> float:
        """The current time in seconds."""
        return self.now_s


def record(msg: str, level: int = logging.WARNING, arg: object = "x") -> logging.LogRecord:
    """A record of logger ``pipeline.runtime.member`` with one argument."""
    return logging.LogRecord("pipeline.runtime.member", level, __file__, 1, msg, (arg,), None)


def test_repeats_back_off_and_say_how_many_were_held() -> None:
    """One warning repeated every 0.5 s for a minute logs a handful of lines, each counted."""
    clock = Clock()
    repeats = RepeatFilter(clock)
    logged = []
    for i in range(120):
        clock.now_s = i * 0.5
        rec = record("poll failed, retrying: %s", arg=f"attempt {i}")  # alike but for a number
        if repeats.filter(rec):
            logged.append(rec.getMessage())
    assert len(logged) == 6  # at 0, 1, 3, 7, 15 and 31 s; the next is due at 63 s
    assert logged[0] == "poll failed, retrying: attempt 0"
    assert logged[1] == (
        f"poll failed, retrying: attempt 2 [1 more like this in the last {FIRST_GAP_S:g}s]"
    )
    assert logged[-1] == "poll failed, retrying: attempt 62 [31 more like this in the last 16s]"


def test_a_quiet_warning_starts_over_and_info_is_untouched() -> None:
    """After MAX_GAP_S of quiet a warning logs at once again; INFO lines are never held."""
    clock = Clock()
    repeats = RepeatFilter(clock)
    assert repeats.filter(record("broker down: %s"))
    assert not repeats.filter(record("broker down: %s"))
    clock.now_s = MAX_GAP_S + 1
    assert repeats.filter(record("broker down: %s"))
    assert all(repeats.filter(record("handled %s", logging.INFO)) for _ in range(5))


def test_different_messages_are_separate() -> None:
    """Warnings that differ in more than numbers do not hold each other back."""
    repeats = RepeatFilter(Clock())
    assert repeats.filter(record("poll failed: %s"))
    assert repeats.filter(record("commit failed: %s"))
    assert repeats.filter(record("lane %s counts as backed up", arg="messages"))
    assert repeats.filter(record("lane %s counts as backed up", arg="engagement"))


def test_http_clients_request_lines_stay_out_of_info_logs() -> None:
    """The HTTP client's INFO line holds the whole URL: a presigned S3 delete's carries a secret.

    With ``PIPELINE_LOG_LEVEL=INFO`` (the Kubernetes config map's) a purge logged one such URL,
    a short-lived bearer credential, per deleted object.
    """
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    root.handlers[:] = []  # as in a fresh process: basicConfig configures only a bare root
    try:
        configure_logging("INFO")
        assert root.isEnabledFor(logging.INFO)
        assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
        assert logging.getLogger("httpx").isEnabledFor(logging.WARNING)
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        logging.getLogger("httpx").setLevel(logging.NOTSET)


def test_warnings_whose_text_differs_each_time_keep_the_table_bounded() -> None:
    """A warning naming a producer's bytes each time does not grow the filter for good.

    Before the bound, 20,000 such warnings left 20,000 entries. A warning still repeating
    when the table fills keeps its backoff: its repeats are held back or logged with their
    count, never logged anew.
    """
    clock = Clock()
    repeats = RepeatFilter(clock)
    assert repeats.filter(record("lane %s stalled", arg="messages"))
    clock.now_s += 0.1
    for n in range(20_000):
        clock.now_s += 0.001
        repeats.filter(record("garbled header from %s", arg=letters(n)))
        if n % 1000 == 0:  # held back, or logged as a counted repeat: never anew
            stalled = record("lane %s stalled", arg="messages")
            assert not repeats.filter(stalled) or "more like this" in stalled.msg
    assert len(repeats._seen) <= MAX_KEPT
    clock.now_s += MAX_GAP_S
    for n in range(MAX_KEPT):
        repeats.filter(record("another text %s", arg=letters(n)))
    assert len(repeats._seen) <= MAX_KEPT


def letters(n: int) -> str:
    """``n`` written in letters, so no two differ only in numbers."""
    out = ""
    while True:
        n, digit = divmod(n, 26)
        out += chr(97 + digit)
        if not n:
            return out


def test_a_flood_of_distinct_warnings_makes_room_a_quarter_at_a_time() -> None:
    """Each time the table is full, at least a quarter of it goes, not just the quiet few.

    Distinct warnings arriving just faster than the table holds a minute of them leave one or
    two quiet whenever it fills. Before, only those went, so every new warning after the first
    fill scanned all 4,096 again: 20,000 such warnings made about 15,900 passes. Now the least
    recently seen make up the quarter, and a warning still repeating keeps its backoff.
    """
    clock = Clock()
    repeats = RepeatFilter(clock)
    passes = 0
    forget = repeats._forget

    def counted(now: float) -> None:
        nonlocal passes
        passes += 1
        forget(now)

    repeats._forget = counted  # type: ignore[method-assign]
    assert repeats.filter(record("lane %s stalled", arg="messages"))
    step = MAX_GAP_S / (MAX_KEPT - 2)  # a full table spans a little over MAX_GAP_S
    warnings = 20_000
    for n in range(warnings):
        clock.now_s += step
        repeats.filter(record("garbled header from %s", arg=letters(n)))
        if n % 8 == 0:  # held back, or logged as a counted repeat: never anew
            stalled = record("lane %s stalled", arg="messages")
            assert not repeats.filter(stalled) or "more like this" in stalled.msg
        assert len(repeats._seen) <= MAX_KEPT
    assert passes <= warnings // (MAX_KEPT // 4) + 1


def test_a_record_judged_by_its_caller_passes_and_is_not_stored() -> None:
    """A failure line its caller backed off passes every time, and leaves no key behind.

    Before, each one shown was stored by its whole text (a traceback of up to 16,000
    characters: ~64 MB at 4,096 keys), and one alike but for numbers was held back.
    """
    repeats = RepeatFilter(Clock())
    for n in range(10):
        judged = record("lane orders: handler failed on orders[0]@%s\nTraceback ...", arg=n)
        setattr(judged, JUDGED, True)
        assert repeats.filter(judged)
        assert "more like this" not in judged.getMessage()
    assert not repeats._seen


def test_an_exact_repeat_key_keeps_its_numbers() -> None:
    """Lanes ``orders1`` and ``orders2`` are not alike by an exact key; a repeat of one is."""
    repeats = RepeatFilter(Clock())

    def keyed(key: str) -> logging.LogRecord:
        rec = record("dead letter: %s")
        setattr(rec, REPEAT_KEY, key)
        return rec

    assert repeats.filter(keyed("lane orders1: exhausted"))
    assert repeats.filter(keyed("lane orders2: exhausted"))
    assert not repeats.filter(keyed("lane orders1: exhausted"))
    assert repeats.filter(record("lane %s", arg="orders1"))  # by text: numbers still blanked
    assert not repeats.filter(record("lane %s", arg="orders2"))


def test_an_exceptions_text_is_a_placeholder_when_its_str_raises() -> None:
    """``error_text`` never raises for an app's exception."""

    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    assert error_text(ValueError("bad 7")) == "bad 7"
    assert error_text(Broken()) == "<Broken.__str__ raised>"
