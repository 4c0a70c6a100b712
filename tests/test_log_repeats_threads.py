"""The repeat filter takes warnings from several threads at once, past its table's size.

A handler's filters run before the handler takes its lock, and the member logs from more than
the event loop's thread (librdkafka's lines come from the threads that poll its clients). Two
threads logging distinct warnings past :data:`MAX_KEPT` made the filter's eviction iterate the
table while the other thread changed it (``dictionary changed size during iteration``) or delete
a key the other had deleted (``KeyError``), raised out of ``log.warning`` into the caller.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator

import pytest

from pipeline.log_repeats import MAX_KEPT, RepeatFilter

_LETTERS = "abcdefghij"


def _text(number: int) -> str:
    """``number`` spelled in letters: the filter blanks digits, so each text stays distinct."""
    return "".join(_LETTERS[int(digit)] for digit in str(number))


@pytest.fixture
def frequent_switches() -> Iterator[None]:
    """Threads switch as often as the interpreter allows: the interleavings come quickly."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def test_two_threads_flooding_distinct_warnings_raise_nothing(frequent_switches: None) -> None:
    """Each thread logs 6 tables' worth of distinct warnings: no call raises, none is lost."""
    del frequent_switches
    repeats = RepeatFilter()
    raised: list[BaseException] = []
    passed = [0, 0]

    def flood(index: int) -> None:
        try:
            for number in range(MAX_KEPT * 6):
                text = f"{_LETTERS[index]} {_text(number)}"
                record = logging.LogRecord(
                    "tests.repeats", logging.WARNING, __file__, 1, text, (), None
                )
                passed[index] += repeats.filter(record)
        except Exception as exc:  # what the caller of log.warning would get
            raised.append(exc)

    threads = [threading.Thread(target=flood, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert raised == []
    assert passed == [MAX_KEPT * 6, MAX_KEPT * 6]  # each text new: every one is logged
