"""The recording side: traceparent parsing, the bounded buffer, nothing for unsampled handlers."""

from __future__ import annotations

import os
import time

import pytest
from tracing.otlp_receiver import OtlpReceiver

from pipeline import tracing
from pipeline.envelope import Message, Record
from pipeline.tracing.record import Buffer, exception_event, parse, spliceable, traceparent
from pipeline.tracing.wire_delivery import wire_context

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


def test_parse_follows_the_w3c_rules_for_version_case_and_extra_fields() -> None:
    """Upper-case or non-hex digits start a new trace, here and in the exporting process.

    A later version's value is read by version 00's fields, whatever follows them after a dash.
    """
    ids = (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True)
    for bad in (
        VALID.upper(),
        VALID[:3] + VALID[3:35].upper() + VALID[35:],
        VALID[:36] + VALID[36:52].upper() + VALID[52:],
        VALID[:-2] + "0B",
        "zz" + VALID[2:],
        "0g" + VALID[2:],
        ".0" + VALID[2:],
        "0A" + VALID[2:],
        VALID + "-what-the-future-will-be-like",  # version 00 is exactly 55 characters
        "cc" + VALID[2:] + ".what-the-future-will-be-like",
        "cc" + VALID[2:-1],
        "cc" + VALID[2:].upper() + "-future",
        VALID[:-2] + "0\u00e9",
    ):
        assert parse(bad) is None, bad
        assert parse(bad.encode("utf-8")) is None, bad
        # The exporting process, reading a delivery's traceparent itself, starts a trace too.
        assert wire_context(bad.encode())[1] == b"", bad
    for future in ("cc" + VALID[2:], "cc" + VALID[2:] + "-what-the-future-will-be-like"):
        assert parse(future) == ids, future
        assert parse(future.encode()) == ids, future
        assert wire_context(future.encode()) == (
            ids[0].to_bytes(16, "big"),
            ids[1].to_bytes(8, "big"),
        )


def test_a_malformed_traceparent_starts_a_trace_even_when_it_ends_as_unsampled_ones_do(
    otlp: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a parent-based sampler only a valid context's flag decides; a malformed one is none.

    An all-zero trace id with flags ``00`` is no context: the delivery starts a trace that the
    root sampler (always on) records. A later version's unsampled context is followed.
    """
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp.endpoint)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
    malformed = b"00-" + b"0" * 32 + VALID[35:-2].encode() + b"00"
    later_unsampled = b"cc" + VALID[2:-2].encode() + b"00-future"
    assert tracing.configure(os.environ, service="pipeline-test")
    try:
        headers = {"traceparent": later_unsampled}
        assert tracing.process(Message("t", 0, 1, b"k", b"v", headers), "lane") is None
        delivery = tracing.process(Message("t", 0, 2, b"k", b"v", {"traceparent": malformed}), "l")
        assert delivery is not None
        tracing.finish(delivery, "handled")
    finally:
        tracing.shutdown()
    (spans,) = otlp.traces().values()
    process = next(span for span in spans if span.name == "process t")
    assert process.parent_id == ""
    assert process.trace_id != "0" * 32


def test_a_spliceable_traceparent_is_one_parse_reads_as_written() -> None:
    """Only a lower-case, well-formed version 00 value is taken as it is; parse agrees with it.

    A send under such a value keeps its trace id digits and changes only the span id, so the
    value must name the ids :func:`parse` reads; anything else goes through :func:`parse`.
    """
    valid = VALID.encode()
    assert spliceable(valid)
    assert spliceable(traceparent(1, 2, sampled=False).encode())
    refused = [
        VALID,  # text: the ingress's rows carry bytes by the time they are sent
        valid.upper(),
        b"01" + valid[2:],
        b"ff" + valid[2:],
        valid[:-1],
        valid + b"0",
        valid.replace(b"4bf9", b"4bg9"),
        valid.replace(b"4bf9", b"4-f9")[:55],
        valid[:36] + b"-" + valid[37:],
        b"00-" + b"0" * 32 + valid[35:],
        valid[:36] + b"0" * 16 + valid[52:],
        valid[:53] + b"0x",
        valid.replace(b"-", b"+"),
        None,
    ]
    for value in refused:
        assert not spliceable(value), value
    for value in (valid, valid[:-2] + b"00", traceparent(2**128 - 1, 2**64 - 1, sampled=True)):
        raw = value if isinstance(value, bytes) else value.encode()
        ids = parse(raw)
        assert spliceable(raw)
        assert ids is not None
        assert raw == traceparent(ids[0], ids[1], sampled=ids[2]).encode()


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


def test_a_handler_span_stays_inside_its_delivery_when_the_wall_clock_steps(
    traced: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler span is timed by the same clock as its delivery's, whatever the wall clock did.

    The wall clock is set 9 s ahead after start-up (an NTP step, a paused VM).
    """
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + 9_000_000_000)
    message = Message("t", 0, 1, b"k", b"v", {"traceparent": VALID.encode()})
    delivery = tracing.process(message, "lane")
    assert delivery is not None
    with tracing.guard(delivery):
        called = time.perf_counter()
        tracing.handler_ran("lane", called, RuntimeError("upstream 503"))
    tracing.finish(delivery, "retried")
    tracing.shutdown()
    (spans,) = traced.traces().values()
    by_name = {span.name: span for span in spans}
    process, handler = by_name["process t"], by_name["handler"]
    guard = by_name["guard"]
    assert (handler.parent_id, guard.parent_id) == (guard.span_id, process.span_id)
    assert process.start_ns <= handler.start_ns <= handler.end_ns <= process.end_ns


def test_a_webhook_its_stages_and_its_send_come_out_as_their_spans(traced: OtlpReceiver) -> None:
    """One record per request still makes the SERVER span and its stages, in one trace.

    The request continues the caller's ``traceparent``; a stage that raised is failed with its
    exception; the row's headers carry the request span's context and the send is its child.
    """
    with tracing.webhook("whatsapp", {"traceparent": VALID}):
        with tracing.stage("verify"):
            pass
        headers = tracing.outgoing({"x-kept": "1"}, "tenant-a")
        with pytest.raises(RuntimeError), tracing.stage("log commit"):
            raise RuntimeError("disk full")
    record = Record(key=b"key-1", value=b"v", headers=headers)
    sends = tracing.sends_started("orders", [record])
    tracing.sends_ended(sends)
    tracing.shutdown()  # flushes: every span is at the receiver
    (spans,) = traced.traces().values()
    by_name = {span.name: span for span in spans}
    server = by_name["POST /hooks/whatsapp"]
    assert (server.trace_id, server.parent_id) == (VALID[3:35], VALID[36:52])
    assert (server.kind, server.error) == ("SPAN_KIND_SERVER", False)
    assert server.attributes == {
        "http.request.method": "POST",
        "http.route": "/hooks/{source}",
        "pipeline.source": "whatsapp",
        "pipeline.tenant": "tenant-a",
    }
    verify, commit = by_name["verify"], by_name["log commit"]
    assert verify.parent_id == commit.parent_id == server.span_id
    assert server.start_ns <= verify.start_ns <= verify.end_ns <= commit.start_ns <= server.end_ns
    assert (verify.error, commit.error, commit.events) == (False, True, ("exception",))
    assert headers["traceparent"] == f"00-{server.trace_id}-{server.span_id}-01"
    send = by_name["send orders"]
    assert (send.parent_id, send.kind) == (server.span_id, "SPAN_KIND_PRODUCER")
    assert send.attributes["messaging.kafka.message.key"] == "key-1"
    assert record.headers["traceparent"] == f"00-{server.trace_id}-{send.span_id}-01".encode()
    assert len(spans) == 4


@pytest.mark.parametrize(
    "carried",
    [VALID.encode(), VALID, VALID.upper().encode(), b"00-malformed", None],
    ids=["bytes as written", "text", "upper case", "malformed", "none"],
)
def test_a_send_continues_the_trace_its_record_carries_whatever_its_form(
    traced: OtlpReceiver, carried: bytes | str | None
) -> None:
    """The send span is the carried context's child, or a new trace's root.

    A new trace when there is no context or it is malformed; the record leaves with the send
    span's ``traceparent``, in lower case.
    """
    headers = {"x-kept": b"1"} if carried is None else {"x-kept": b"1", "traceparent": carried}
    record = Record(key=b"key-1", value=b"v", headers=headers)
    tracing.sends_ended(tracing.sends_started("orders", [record]))
    tracing.shutdown()
    (spans,) = traced.traces().values()
    (send,) = spans
    parsed = parse(carried)
    if parsed is not None:
        assert (send.trace_id, send.parent_id) == (f"{parsed[0]:032x}", f"{parsed[1]:016x}")
    else:
        assert send.parent_id in ("", None)
    assert record.headers["traceparent"] == f"00-{send.trace_id}-{send.span_id}-01".encode()
    assert record.headers["x-kept"] == b"1"
    assert headers.get("traceparent") == carried  # the caller's headers are not changed


def test_under_a_parent_based_sampler_a_send_follows_the_carried_flag(
    otlp: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sampled context gets its send span; an unsampled one leaves as it came, unrecorded."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp.endpoint)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
    unsampled = VALID[:-2].encode() + b"00"
    sampled = Record(key=None, value=b"v", headers={"traceparent": VALID.encode()})
    skipped = Record(key=None, value=b"v", headers={"traceparent": unsampled})
    assert tracing.configure(os.environ, service="pipeline-test")
    try:
        tracing.sends_ended(tracing.sends_started("orders", [sampled, skipped]))
    finally:
        tracing.shutdown()
    (spans,) = otlp.traces().values()
    (send,) = spans
    assert (send.trace_id, send.parent_id) == (VALID[3:35], VALID[36:52])
    assert sampled.headers["traceparent"] == f"00-{send.trace_id}-{send.span_id}-01".encode()
    assert skipped.headers["traceparent"] == unsampled


def test_a_traceparent_with_a_byte_that_is_not_ascii_starts_a_trace_and_raises_nothing(
    otlp: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 55-byte value ending in a non-ASCII byte, as any producer may send, is no context.

    The member's hook, a routed send and a produce each start a trace (the default, parent-based
    sampler) instead of raising out of the consumer.
    """
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp.endpoint)
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    hostile = VALID[:-1].encode() + b"\xe9"
    assert tracing.configure(os.environ, service="pipeline-test")
    try:
        delivery = tracing.process(Message("t", 0, 1, b"k", b"v", {"traceparent": hostile}), "l")
        assert delivery is not None
        tracing.finish(delivery, "handled")
        copy = {"traceparent": hostile}
        with tracing.sending("t.retry.5s", copy, "retry"):
            pass
        record = Record(key=None, value=b"v", headers={"traceparent": hostile})
        tracing.sends_ended(tracing.sends_started("orders", [record]))
    finally:
        tracing.shutdown()
    roots = [s for trace in otlp.traces().values() for s in trace if s.parent_id == ""]
    assert sorted(s.name for s in roots) == ["process t", "send orders", "send t.retry.5s"]
    assert VALID[3:35] not in {s.trace_id for s in roots}


@pytest.mark.parametrize("attempt", [b"-99999999999999999999999", b"99999999999999999999999"])
def test_an_attempt_header_beyond_int64_is_exported_as_the_first_attempt(
    traced: OtlpReceiver, attempt: bytes
) -> None:
    """A ``pl-attempt`` no int64 holds neither stops the exporting process nor spoils its batch."""
    for offset, count in enumerate((attempt, b"2")):
        headers = {"traceparent": VALID.encode(), "pl-attempt": count}
        message = Message("t.retry.5s", 0, offset, b"k", b"v", headers)
        delivery = tracing.process(message, "lane")
        assert delivery is not None
        tracing.finish(delivery, "handled")
    tracing.shutdown()
    processed = [s for s in traced.spans if s.name == "process t.retry.5s"]
    attempts = sorted(s.attributes["pipeline.attempt"] for s in processed)
    assert attempts == [1, 2]


def test_an_attempt_header_on_a_main_topic_is_exported_as_the_first_attempt(
    traced: OtlpReceiver,
) -> None:
    """Only retry-tier copies carry an attempt: a producer's ``pl-attempt: 99`` on ``t`` is 1."""
    message = Message("t", 0, 0, b"k", b"v", {"traceparent": VALID.encode(), "pl-attempt": b"99"})
    delivery = tracing.process(message, "lane")
    assert delivery is not None
    tracing.finish(delivery, "handled")
    tracing.shutdown()
    (span,) = [s for s in traced.spans if s.name == "process t"]
    assert span.attributes["pipeline.attempt"] == 1


def test_a_handler_error_whose_text_is_not_valid_unicode_is_exported_with_its_batch(
    traced: OtlpReceiver,
) -> None:
    """An exception text with a lone surrogate (a name read with surrogateescape) is replaced.

    It neither stops the exporting process nor loses the spans exported with it.
    """
    for offset, error in enumerate((OSError("no file b'\udcff.csv'"), None)):
        message = Message("t", 0, offset, b"k", b"v", {"traceparent": VALID.encode()})
        delivery = tracing.process(message, "lane")
        assert delivery is not None
        with tracing.guard(delivery):
            tracing.handler_ran("lane", time.perf_counter(), error)
        tracing.finish(delivery, "retried" if error else "handled")
    tracing.shutdown()
    handlers = [s for s in traced.spans if s.name == "handler"]
    assert sorted(s.error for s in handlers) == [False, True]


def test_a_webhook_continues_a_traceparent_sent_with_spaces_around_it(
    traced: OtlpReceiver,
) -> None:
    """Optional whitespace around the value (the HTTP layer keeps the trailing) is no part of it.

    The W3C rules read a value with spaces or tabs around it as the value without them.
    """
    for value in (f" {VALID}", f"{VALID} \t", f"\t {VALID} \t"):
        with tracing.webhook("whatsapp", {"traceparent": value}):
            pass
    tracing.shutdown()
    servers = [s for s in traced.spans if s.name == "POST /hooks/whatsapp"]
    assert [(s.trace_id, s.parent_id) for s in servers] == [(VALID[3:35], VALID[36:52])] * 3


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("a broken __str__ of the app's")


def test_an_exception_whose_str_raises_is_recorded_by_a_placeholder() -> None:
    """A traced handler's failure is recorded before it is routed: its event must not raise.

    ``str(error)`` raised out of the recording, so the failure was never routed and its
    message was redelivered for ever, while tracing sampled it.
    """
    name, _, attributes = exception_event(_Unprintable(), 1)
    assert name == "exception"
    assert attributes["exception.message"] == "<_Unprintable.__str__ raised>"
    assert attributes["exception.type"] == "_Unprintable"
