"""Fixtures the admission tests share."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import AbstractConnection


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the commands redis-py sends, each command of a pipeline on its own."""
    count = [0]
    pack = AbstractConnection.pack_command

    def counted(self: AbstractConnection, *args: object) -> list[bytes]:
        count[0] += 1
        return pack(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(AbstractConnection, "pack_command", counted)
    return count
