"""The error digest groups failures by where they were raised, whatever their message or data.

It is the ``pl-error-digest`` header of every retried and dead-lettered message, so operators
(and ``pipeline redrive``'s listings) can count failures by cause: it must stay the same for the
same raising path and differ for another path or another exception class.
"""

from __future__ import annotations

import hashlib
import traceback
from collections.abc import Callable

import pytest

from pipeline.retry.router import error_digest


def _inner(value: int) -> None:
    raise ValueError(f"bad value {value}")


def _outer(value: int) -> None:
    _inner(value)


def _elsewhere(value: int) -> None:
    raise ValueError(f"bad value {value}")


def _caught(fn: Callable[[int], None], value: int) -> BaseException:
    with pytest.raises((ValueError, KeyError)) as info:
        fn(value)
    return info.value


def test_the_same_raising_path_gives_the_same_digest_whatever_the_message() -> None:
    """Two failures of one line with different messages are one cause."""
    assert error_digest(_caught(_outer, 1)) == error_digest(_caught(_outer, 2))


def test_another_path_or_class_gives_another_digest() -> None:
    """Another function raising, or another exception class, is another cause."""
    first = error_digest(_caught(_outer, 1))
    assert error_digest(_caught(_elsewhere, 1)) != first

    def other_class(_value: int) -> None:
        raise KeyError("k")

    assert error_digest(_caught(other_class, 1)) != first


def test_the_digest_is_the_class_and_every_frames_file_and_function() -> None:
    """The digest is that of the class and each frame's file and function, in order."""
    error = _caught(_outer, 3)
    frames = traceback.extract_tb(error.__traceback__)
    assert [f.name for f in frames][-2:] == ["_outer", "_inner"]
    shape = "|".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.name}" for f in frames)
    expected = hashlib.sha256(f"ValueError|{shape}".encode()).hexdigest()[:12]
    assert error_digest(error) == expected


def test_an_error_never_raised_has_a_digest_of_its_class_alone() -> None:
    """An exception with no traceback (made, not raised) still gets a digest."""
    expected = hashlib.sha256(b"RuntimeError|").hexdigest()[:12]
    assert error_digest(RuntimeError("made, not raised")) == expected
