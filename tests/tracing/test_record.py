"""The recording side: traceparent parsing, the bounded buffer, nothing for unsampled handlers."""

from __future__ import annotations

import os
import time

import pytest
from tracing.otlp_receiver import OtlpReceiver

from pipeline import tracing
from pipeline.envelope import Message
from pipeline.tracing.record import Buffer, parse, traceparent

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_parse_takes_w3c_traceparents_and_refuses_the_rest() -> None:
    """Valid ones (str or bytes) give their ids and flag; malformed ones give None."""
    ids = (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True)
    assert parse(VALID) == ids
    assert parse(VALID.encode()) == ids
    assert parse(VALID[:-2] + "00") == (*ids[:2], False)
    assert traceparent(*ids[:2], sampled=True) == VALID
    for bad in (
        None,
        "",
        VALID[:-1],
        VALID.replace("4bf9", "4bg9"),
        VALID.replace("4bf9", "_bf9"),
        VALID.replace("4bf9", " bf9"),
        "00-" + "0" * 32 + VALID[35:],
        VALID[:36] + "0" * 16 + VALID[52:],
        "ff" + VALID[2:],
        VALID.replace("-", "+"),
    ):
        assert parse(bad) is None, bad


def test_the_buffer_wakes_its_sender_at_a_batch_and_drops_beyond_its_limit() -> None:
    """A full batch wakes the sender once; past the limit records are counted, not kept."""
    wakes = []
    buffer = Buffer(limit=5, batch=3, wake=lambda: wakes.append(1))
    for i in range(7):
        buffer.add(("s", i))
    assert len(wakes) == 1
    assert [r[1] for r in buffer.take()] == [0, 1, 2, 3, 4]
    assert buffer.dropped == 2
    assert buffer.take() == []


def test_an_unsampled_delivery_records_no_handler_span(
    otlp: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a parent-based sampler the handler of an unsampled message records nothing."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp.endpoint)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
    assert tracing.configure(os.environ, service="pipeline-test")
    try:
        unsampled = Message("t", 0, 1, b"k", b"v", {"traceparent": VALID[:-2].encode() + b"00"})
        assert tracing.process(unsampled, "lane") is None
        tracing.handler_ran("lane", time.perf_counter(), None)
    finally:
        tracing.shutdown()
    assert otlp.traces() == {}
