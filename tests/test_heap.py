"""A serving process's start-up objects and freed C heap (pipeline/heap.py).

The start-up objects are set aside from the collector's full passes; the C heap's free pages are
handed back once the process goes quiet after work.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from pipeline.heap import HeapTrim, freeze_startup, heap_trim, keep_trimmed


class _Node:
    """A container the cyclic collector tracks (and weakref can watch)."""

    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Give the frozen objects back to the collector after the test."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def _tracked(obj: object) -> bool:
    """Whether ``obj`` is in one of the three generations the collector walks."""
    return any(o is obj for generation in range(3) for o in gc.get_objects(generation))


@pytest.mark.usefixtures("unfrozen")
def test_objects_alive_at_startup_are_set_aside_and_later_ones_are_not() -> None:
    """What lives when start-up ends leaves the generations; what is made later stays in them."""
    kept = _Node()
    assert _tracked(kept)
    assert freeze_startup() > 0  # frozen objects freed by reference counting leave the count
    assert not _tracked(kept)  # a full pass no longer walks it
    made_later = _Node()
    assert _tracked(made_later)


@pytest.mark.usefixtures("unfrozen")
def test_garbage_made_before_is_collected_not_frozen() -> None:
    """A cycle that is already garbage is freed by the collection before the freeze."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle: only the cyclic collector can free it
    watch = weakref.ref(a)
    del a, b
    freeze_startup()
    assert watch() is None


class _Script:
    """An activity count read from a script; ``stop`` is set when the script has run out."""

    def __init__(self, counts: list[int], stop: asyncio.Event) -> None:
        self._counts = iter(counts)
        self._last = 0
        self._stop = stop

    def __call__(self) -> int:
        nxt = next(self._counts, None)
        if nxt is None:
            self._stop.set()
            return self._last
        self._last = nxt
        return nxt


class _CountedTrim:
    """glibc's malloc_trim, counting its calls and their answers."""

    def __init__(self, trim: HeapTrim) -> None:
        self._trim = trim
        self.answers: list[int] = []

    def __call__(self, pad: int, /) -> int:
        answer = self._trim(pad)
        self.answers.append(answer)
        return answer


def test_this_glibc_has_a_trim_that_runs_and_answers() -> None:
    """On glibc the C library's ``malloc_trim`` is found, runs and says whether pages went back."""
    trim = heap_trim()
    assert trim is not None
    blobs = [bytes(4096) for _ in range(10_000)]  # malloc'd (not pymalloc): 40 MB, then freed
    del blobs
    assert trim(0) in (0, 1)


def test_a_c_library_without_malloc_trim_gives_none_and_nothing_runs() -> None:
    """Where the library lacks the symbol (musl, macOS) or cannot be opened: no trim, no error."""

    def no_library(_name: str | None) -> object:
        raise OSError("not found")

    assert heap_trim(lambda _name: object()) is None  # opened, but no malloc_trim in it
    missing = heap_trim(no_library)
    assert missing is None
    never_stopped = asyncio.Event()
    assert asyncio.run(keep_trimmed(lambda: 1, never_stopped, missing, check_s=0)) == 0


def _trimmed(counts: list[int], min_interval_s: float) -> tuple[int, _CountedTrim]:
    """:func:`keep_trimmed` over the activity ``counts`` with glibc's trim, checking at once.

    What it returned (the trims it made) and the trim, counting its calls and their answers.
    """
    trim = heap_trim()
    assert trim is not None
    counted = _CountedTrim(trim)

    async def run() -> int:
        stop = asyncio.Event()
        activity = _Script(counts, stop)
        return await keep_trimmed(activity, stop, counted, check_s=0, min_interval_s=min_interval_s)

    return asyncio.run(run()), counted


def test_the_heap_is_trimmed_once_after_each_busy_spell() -> None:
    """A count that moved and then stood still is trimmed for, once; a steady count is not."""
    # start 0; busy 1, 2; quiet 2 (trim); quiet 2, 2 (trimmed already); busy 5; quiet 5 (trim)
    trims, counted = _trimmed([0, 1, 2, 2, 2, 2, 5, 5], min_interval_s=0)
    assert trims == 2
    assert len(counted.answers) == 2
    assert all(answer in (0, 1) for answer in counted.answers)


def test_trims_are_at_least_the_minimum_interval_apart() -> None:
    """Busy spells closer together than the minimum interval get no trim of their own."""
    trims, counted = _trimmed([0, 1, 1, 2, 2], min_interval_s=3600)
    assert trims == 0
    assert counted.answers == []
