"""Helpers for tests, importable by name from any test module (``from support import ...``).

Test modules must not import ``conftest``: several directories have one, and which of them the
name ``conftest`` means depends on collection order.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable

import pytest

from pipeline.config import Settings, load_settings

IN_CI = os.environ.get("CI", "").lower() == "true"


def reachable(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port`` within a second."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Skip (locally) or fail (under CI=true) when a service does not answer."""
    if reachable(host, port):
        return
    message = f"{name} is not reachable on {host}:{port}; start it with `make services`"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def test_settings(**overrides: object) -> Settings:
    """Settings for tests: the environment's service URLs with fast group timings."""
    base = load_settings()
    kafka = {
        "bootstrap_servers": base.kafka.bootstrap_servers,
        "session_timeout_ms": 3000,
        "request_timeout_ms": 5000,
    }
    redis = {"url": base.redis.url, "heartbeat_ms": 100, "lease_ms": 1500}
    return load_settings(kafka=kafka, redis=redis, **overrides)


test_settings.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


_declared: list[tuple[Settings, str, tuple[str, ...]]] = []


def delete_after_test(transport: object, names: Iterable[str]) -> None:
    """Have the topics ``names`` on ``transport``'s broker deleted when the current test ends.

    The autouse fixture of ``tests/conftest.py`` deletes them after the test, passed or failed,
    through a fresh transport built from the same settings (the test's own may be closed by
    then).
    """
    settings: Settings | None = getattr(transport, "_settings", None)
    if settings is None:  # an in-memory transport: nothing outlives the test
        return
    delete_topics_after_test(settings, transport.name, names)  # type: ignore[attr-defined]


def delete_topics_after_test(settings: Settings, transport: str, names: Iterable[str]) -> None:
    """:func:`delete_after_test` for topics another process made (``pipeline topics apply``)."""
    _declared.append((settings, transport, tuple(names)))


async def delete_declared() -> None:
    """Delete every topic registered by :func:`delete_after_test`; missing ones are fine."""
    from pipeline.errors import PipelineError  # noqa: PLC0415 - keeps this module light
    from pipeline.transport import create_transport  # noqa: PLC0415

    pending = list(_declared)
    _declared.clear()
    for settings, name, topics in pending:
        transport = create_transport(settings, name)
        admin = transport.admin()
        try:
            for topic in topics:
                with contextlib.suppress(PipelineError):
                    await admin.delete_topic(topic)
        finally:
            await transport.close()


def has_declared() -> bool:
    """Whether a test registered topics to delete."""
    return bool(_declared)
