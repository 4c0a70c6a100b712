"""Redis Functions libraries are loaded under versioned names (``pipeline.redis_functions``)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from pipeline.redis_functions import FunctionLibrary, versioned


def _library(unique: str, answer: str) -> str:
    return (
        f"#!lua name=pl_test_{unique}\n"
        f"redis.register_function('answer_{unique}', function() return '{answer}' end)\n"
        f"redis.register_function{{function_name = 'peek_{unique}', "
        f"callback = function() return '{answer}' end, flags = {{'no-writes'}}}}\n"
    )


async def test_two_releases_of_a_library_run_side_by_side(redis: Redis, unique: str) -> None:
    """An old and a new release share one Redis; neither replaces the other's functions."""
    old, new = (
        FunctionLibrary(redis, _library(unique, "old")),
        FunctionLibrary(redis, _library(unique, "new")),
    )
    assert old.version != new.version
    assert await old.fcall(f"answer_{unique}", [], []) == b"old"
    assert await new.fcall(f"answer_{unique}", [], []) == b"new"
    assert await old.fcall(f"answer_{unique}", [], []) == b"old"  # not replaced by the new one
    assert await new.fcall(f"peek_{unique}", [], []) == b"new"  # the table form is versioned too
    for lib in (old, new):
        await redis.function_delete(f"pl_test_{unique}_{lib.version}")


async def test_a_library_redis_lost_is_loaded_again(redis: Redis, unique: str) -> None:
    """After FUNCTION DELETE (or a Redis that lost its data) the next call reloads it."""
    lib = FunctionLibrary(redis, _library(unique, "here"))
    assert await lib.fcall(f"answer_{unique}", [], []) == b"here"
    await redis.function_delete(f"pl_test_{unique}_{lib.version}")
    assert await lib.fcall(f"answer_{unique}", [], []) == b"here"
    await redis.function_delete(f"pl_test_{unique}_{lib.version}")


def test_the_version_follows_the_code() -> None:
    """Same code, same names; a changed line, new names; no header, a clear error."""
    source = _library("x", "a")
    assert versioned(source) == versioned(source)
    assert versioned(source)[1] != versioned(_library("x", "b"))[1]
    code, version = versioned(source)
    assert code.startswith(f"#!lua name=pl_test_x_{version}\n")
    assert f"'answer_x_{version}'" in code
    assert f"'peek_x_{version}'" in code
    with pytest.raises(ValueError, match="#!lua name="):
        versioned("return 1")
