"""Helpers for tests, importable by name from any test module (``from support import ...``).

Test modules must not import ``conftest``: several directories have one, and which of them the
name ``conftest`` means depends on collection order.
"""

from __future__ import annotations

import os
import socket

import pytest

from pipeline.config import Settings, load_settings

IN_CI = os.environ.get("CI", "").lower() == "true"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Skip (locally) or fail (under CI=true) when a service does not answer."""
    if _reachable(host, port):
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
