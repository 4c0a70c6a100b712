"""A ``rediss://`` URL at a plain-text Redis port: the line says TLS, not "start it"."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from pipeline.config import load_settings
from pipeline.reachability import named_with_fix, unreachable

TIMED_OUT = "Timeout connecting to server"


def as_tls(url: str) -> str:
    """``url`` (``redis://``) with the ``rediss://`` scheme, same host, port and database."""
    return "rediss://" + url.removeprefix("redis://")


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes TCP connections (the kernel's backlog) and never answers a byte."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port bound, not listening: connections to it are refused (a Redis that is down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound.getsockname()[1]


def test_topics_list_says_the_plain_port_does_not_speak_tls(redis_service: str) -> None:
    """`pipeline topics list` at rediss:// of the running plain Redis: one TLS line, exit 1."""
    url = as_tls(redis_service)
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "topics", "list", "-t", "redis"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PIPELINE_REDIS__URL": url,
            "PIPELINE_REDIS__SOCKET_TIMEOUT_S": "1",
        },
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"TLS handshake with Redis at {url} (PIPELINE_REDIS__URL) timed out" in line
    assert "does not speak TLS? use redis:// for a plain-text port" in line
    assert "make services" not in line


def test_a_plain_port_is_named_in_the_fix_of_other_commands(redis_service: str) -> None:
    """The fix that follows another command's error says the same (cancel, produce, tail)."""
    settings = load_settings(redis={"url": as_tls(redis_service)})
    line = named_with_fix(settings, "redis", reason=f"produce: redis unreachable: {TIMED_OUT}")
    assert "does not speak TLS?" in line
    assert "make services" not in line


def test_a_handshake_closed_without_a_word_at_an_open_port_is_tls(silent_port: int) -> None:
    """A rediss:// connection closed on its greeting ("Error connecting to ...") at an open port."""
    settings = load_settings(redis={"url": f"rediss://127.0.0.1:{silent_port}/0"})
    line = unreachable(settings, "redis", f"Error connecting to 127.0.0.1:{silent_port}.")
    assert line.startswith(f"TLS handshake with Redis at rediss://127.0.0.1:{silent_port}/0")
    assert "failed" in line
    assert "does not speak TLS?" in line


def test_a_timeout_at_a_port_that_does_not_answer_plain_text_keeps_the_advice(
    silent_port: int,
) -> None:
    """A port that takes connections but answers no PING (a TLS Redis too busy) is not blamed."""
    settings = load_settings(redis={"url": f"rediss://127.0.0.1:{silent_port}/0"})
    line = unreachable(settings, "redis", TIMED_OUT)
    assert line.startswith("cannot reach Redis at")
    assert "make services" in line


def test_a_host_that_is_down_keeps_the_advice(closed_port: int) -> None:
    """A rediss:// timeout at a port nobody listens on is still "cannot reach ...; start it"."""
    settings = load_settings(redis={"url": f"rediss://127.0.0.1:{closed_port}/0"})
    for reason in (TIMED_OUT, f"Error connecting to 127.0.0.1:{closed_port}."):
        line = unreachable(settings, "redis", reason)
        assert line.startswith(f"cannot reach Redis at rediss://127.0.0.1:{closed_port}/0"), line
        assert "make services" in line


def test_a_plain_url_that_timed_out_is_not_asked_about_tls(redis_service: str) -> None:
    """Only a rediss:// URL is looked at: a redis:// one that timed out keeps the advice."""
    port = urlsplit(redis_service).port
    settings = load_settings(redis={"url": f"redis://127.0.0.1:{port}/0"})
    line = unreachable(settings, "redis", TIMED_OUT)
    assert line.startswith("cannot reach Redis at")
