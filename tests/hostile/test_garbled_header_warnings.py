"""Garbled origin and due headers are one warning line each, which repeats back off.

A producer may write garbage into ``pl-origin-*`` or ``pl-due-ms`` on every message, each
different. The member reads each such message as a first delivery, or as due now, and says so
in a line whose text names the header and the message's position, not the garbage: the log's
:class:`~pipeline.log_repeats.RepeatFilter` backs off repeats of a text (numbers aside), so
10,000 such messages a second are a few lines, not 10,000.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

import pytest

from pipeline import headers as h
from pipeline.envelope import Message, TopicPartition
from pipeline.log_repeats import RepeatFilter
from pipeline.retry.guard_store import start_of
from pipeline.runtime.due import DueGate
from pipeline.runtime.flow import PauseBook

TIER = "orders.retry.5s"
MESSAGES = 500


class _Consumer:
    """Pauses and resumes nothing (the gate holds nothing: every message is due now)."""

    def pause(self, partitions: Sequence[TopicPartition]) -> None:
        """No pause."""

    def resume(self, partitions: Sequence[TopicPartition]) -> None:
        """No resume."""


def _garbage(rng: random.Random) -> bytes:
    return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 30)))


def _logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warnings the repeat filter of a command's log lets through, as logged."""
    repeats = RepeatFilter(clock=lambda: 0.0)  # all in one instant: each text once
    return [r.getMessage() for r in caplog.records if repeats.filter(r)]


def test_garbled_origins_are_few_lines(caplog: pytest.LogCaptureFixture) -> None:
    """Each garbled origin runs as a first delivery; the lines say why, in a few texts."""
    rng = random.Random(7)
    shapes = [
        {h.ORIGIN_TOPIC: b"orders", h.ORIGIN_PARTITION: b"0"},
        {h.ORIGIN_TOPIC: b"other", h.ORIGIN_PARTITION: b"0", h.ORIGIN_OFFSET: b"1"},
        {h.ORIGIN_TOPIC: b"\xff", h.ORIGIN_PARTITION: b"0", h.ORIGIN_OFFSET: b"1"},
    ]
    with caplog.at_level(logging.WARNING, logger="pipeline.retry.guard_store"):
        for offset in range(MESSAGES):
            headers = dict(shapes[offset % len(shapes)])
            headers[rng.choice(list(headers))] += _garbage(rng)
            message = Message(TIER, 0, offset, b"k", b"", headers)
            start = start_of(message, ordered=True)
            assert start.ident == start.position == f"{TIER}:0:{offset}"
    assert len(caplog.records) == MESSAGES
    lines = _logged(caplog)
    assert 1 <= len(lines) <= 4, lines  # one per header at fault, whatever it held
    assert all(f"{TIER}:0:" in line and "first delivery" in line for line in lines)


def test_garbled_due_times_are_few_lines(caplog: pytest.LogCaptureFixture) -> None:
    """Each garbled pl-due-ms is due now; a copy without one is due now without a word."""
    rng = random.Random(11)
    released: list[Message] = []
    gate: DueGate[Message] = DueGate(
        PauseBook(_Consumer()),  # type: ignore[arg-type]
        released.append,
        clock_ms=lambda: 1_000,
    )
    with caplog.at_level(logging.WARNING, logger="pipeline.runtime.due"):
        gate.offer(Message(TIER, 0, 0, b"k", b"", {}))
        assert not caplog.records
        for offset in range(1, MESSAGES + 1):
            due = b"9" * rng.randrange(20, 60) if offset % 2 else _garbage(rng) + b"x"
            gate.offer(Message(TIER, 0, offset, b"k", b"", {h.DUE_MS: due}))
    assert len(released) == MESSAGES + 1
    assert len(caplog.records) == MESSAGES
    lines = _logged(caplog)
    assert len(lines) == 1, lines
    assert h.DUE_MS in lines[0]
    assert "due now" in lines[0]
