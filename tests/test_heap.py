"""A serving process's start-up objects are set aside from the collector's full passes."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from pipeline.heap import freeze_startup


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
