"""The example consumers' unit tests run with no service at all: any network connection fails."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse every outgoing connection, so a test that needs Redis, Kafka or Postgres fails."""

    def refuse(self: socket.socket, address: object) -> None:
        raise OSError(f"the consumer tests must not connect anywhere (tried {address!r})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
