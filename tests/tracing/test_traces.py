"""One trace per webhook: ingress, log, produce, retry tier, dead letter and redrive, exported.

A signed webhook goes through the ingress (SQLite log), the real broker, a member whose handler
fails it once (first retry tier, then success); another is dead-lettered, redriven and then
handled. The suite's own OTLP receiver decodes what the SDK exported, and each webhook must be
one trace with every stage's span under the right parent, in order. When Jaeger is built and
running (``make services jaeger``) the same spans are sent to it and read back from its query
API.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from contract.helpers import consume_until, make_topic
from ingress.helpers import META, build, client, meta_body
from ingress.signing import hub_signature
from runtime.helpers import FAST, declare, eventually, lane_spec, running
from tracing.otlp_receiver import OtlpReceiver, Span

from pipeline import headers as h
from pipeline import tracing
from pipeline.errors import DeadLetter
from pipeline.ingress.dispatch import Dispatcher
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.redrive.redrive import Redrive, group_name
from pipeline.redrive.select import Selection
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

SECRET = "meta-app-secret"  # noqa: S105 - a test secret
PROVIDER_SPAN = "00f067aa0ba902b7"
JAEGER = "http://127.0.0.1:16686"


def by_id(trace: list[Span]) -> dict[str, Span]:
    """The spans of a trace by span id."""
    return {span.span_id: span for span in trace}


def chain(trace: list[Span], leaf: Span) -> list[str]:
    """The names from ``leaf`` up to the trace's root, root first."""
    spans, names = by_id(trace), []
    span: Span | None = leaf
    while span is not None:
        names.append(span.name)
        span = spans.get(span.parent_id)
    return names[::-1]


def the(trace: list[Span], name: str, nth: int = 0) -> Span:
    """The ``nth`` span (in start order) called ``name``."""
    return [span for span in trace if span.name == name][nth]


def assert_in_order(spans: list[Span]) -> None:
    """Each span starts no earlier than the one before it (1 ms of clock rounding allowed)."""
    for before, after in itertools.pairwise(spans):
        assert after.start_ns >= before.start_ns - 1_000_000, (before.name, after.name)


async def test_one_trace_per_webhook_through_retry_dead_letter_and_redrive(
    tmp_path: Path,
    sqlite_store: SqliteLogStore,
    transport: Transport,
    unique: str,
    traced: OtlpReceiver,
    subtests: pytest.Subtests,
) -> None:
    """A retried webhook and a dead-lettered, redriven one are each one trace, stage by stage."""
    provider_trace = uuid.uuid4().hex  # a trace of its own (Jaeger keeps every run's spans)
    spec = lane_spec(f"traced_{unique}", 2, retry={"tiers": ["200ms"], "max_attempts": 3})
    topic, retry_topic, dlq = spec.name, spec.retry_topic_names()[0], spec.dead_letter
    await declare(transport, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if b"wamid.1" in event and ctx.attempt == 1:
            raise RuntimeError("upstream 503")
        if b"wamid.2" in event and h.REDRIVE_COUNT not in ctx.message.headers:
            raise DeadLetter("account not found")

    sources = build(tmp_path, {"whatsapp": {**META, "topic": topic, "routes": []}}, {topic: topic})
    producer = transport.producer()
    dispatcher = Dispatcher(producer, sqlite_store)
    _, http = client(sources, sqlite_store, dispatcher)
    flaky, dead = meta_body(1), meta_body(2)
    provider = {"traceparent": f"00-{provider_trace}-{PROVIDER_SPAN}-01"}
    async with http:
        for body, extra in ((flaky, provider), (dead, {})):
            headers = {"x-hub-signature-256": hub_signature(SECRET, body), **extra}
            answer = await http.post("/hooks/whatsapp", content=body, headers=headers)
            assert answer.json()["status"] == "accepted"
    member = Member(app, transport, f"g-{unique}", FAST)
    async with running(member):
        await eventually(lambda: member.stats.handled == 1 and member.stats.dead_lettered == 1)
        report = await Redrive(transport, dlq, Selection()).run()
        assert report.moved == 1
        await eventually(lambda: member.stats.handled == 2)
    await dispatcher.close()
    await producer.close()
    tracing.shutdown()  # exports everything still buffered
    admin = transport.admin()
    await admin.delete_group(f"g-{unique}", [topic, retry_topic])
    await admin.delete_group(group_name(dlq, None, Selection()), [dlq])
    for name in spec.topic_names():
        await admin.delete_topic(name)

    traces = traced.traces()
    assert len(traces) == 2, {t: [s.name for s in spans] for t, spans in traces.items()}
    retried = traces[provider_trace]  # the provider's trace, continued
    (redriven,) = (spans for trace_id, spans in traces.items() if trace_id != provider_trace)
    assert_retried(retried, topic, retry_topic)
    assert_redriven(redriven, topic, dlq)
    with subtests.test("the same traces read back from Jaeger"):
        _check_jaeger(traced, {provider_trace: retried, redriven[0].trace_id: redriven})


def assert_retried(retried: list[Span], topic: str, retry_topic: str) -> None:
    """The provider's trace: ingress, first run failed, retry tier, second run handled."""
    root = the(retried, "POST /hooks/whatsapp")
    assert (root.parent_id, root.kind) == (PROVIDER_SPAN, "SPAN_KIND_SERVER")
    assert the(retried, "verify").parent_id == root.span_id
    assert the(retried, "log commit").parent_id == root.span_id
    second_handler = the(retried, "handler", 1)
    assert chain(retried, second_handler) == [
        "POST /hooks/whatsapp",
        f"send {topic}",
        f"process {topic}",
        "guard",
        f"send {retry_topic}",
        f"process {retry_topic}",
        "guard",
        "handler",
    ]
    assert the(retried, "handler", 0).error
    assert not second_handler.error
    first = the(retried, f"process {topic}")
    assert first.kind == "SPAN_KIND_CONSUMER"
    assert first.attributes["messaging.destination.name"] == topic
    assert first.attributes["messaging.operation.type"] == "process"
    assert first.attributes["pipeline.outcome"] == "retried"
    assert "retried" in first.events
    retry_send = the(retried, f"send {retry_topic}")
    assert (retry_send.kind, retry_send.attributes["pipeline.route"]) == (
        "SPAN_KIND_PRODUCER",
        "retry",
    )
    waits = [s for s in retried if s.name == "partition wait"]
    assert [by_id(retried)[w.parent_id].name for w in waits] == [
        f"send {topic}",
        f"send {retry_topic}",
    ]
    assert_in_order(
        [
            root,
            the(retried, "verify"),
            the(retried, "log commit"),
            the(retried, f"send {topic}"),
            first,
            the(retried, "handler", 0),
            retry_send,
            the(retried, f"process {retry_topic}"),
            second_handler,
        ]
    )


def assert_redriven(redriven: list[Span], topic: str, dlq: str) -> None:
    """A new trace: ingress, first run dead-lettered, redrive, second run handled."""
    last = the(redriven, "handler", 1)
    assert chain(redriven, last) == [
        "POST /hooks/whatsapp",
        f"send {topic}",
        f"process {topic}",
        "guard",
        f"send {dlq}",
        f"send {topic}",
        f"process {topic}",
        "guard",
        "handler",
    ]
    dead_letter = the(redriven, f"send {dlq}")
    assert dead_letter.attributes["pipeline.route"] == "dead_letter"
    assert dead_letter.attributes["pipeline.dead_reason"] == "fatal"
    assert "dead_lettered" in the(redriven, f"process {topic}").events
    assert_in_order(
        [
            the(redriven, f"send {topic}", 0),
            the(redriven, f"process {topic}", 0),
            dead_letter,
            the(redriven, f"send {topic}", 1),
            the(redriven, f"process {topic}", 1),
            last,
        ]
    )


def _check_jaeger(received: OtlpReceiver, traces: dict[str, list[Span]]) -> None:
    """Send the spans to Jaeger too and read each trace back: same spans, same parents."""
    try:
        urllib.request.urlopen(f"{JAEGER}/api/services", timeout=2).close()  # noqa: S310
    except OSError:
        pytest.skip("Jaeger is not running on 16686 (make services jaeger): OTLP receiver only")
    for body in received.bodies:
        request = urllib.request.Request(
            "http://127.0.0.1:4318/v1/traces",
            data=body,
            headers={"content-type": "application/x-protobuf"},
        )
        urllib.request.urlopen(request, timeout=5).close()  # noqa: S310
    for trace_id, spans in traces.items():
        expected = {(s.span_id, s.parent_id, s.name) for s in spans if s.trace_id == trace_id}
        deadline = time.monotonic() + 30
        while (found := _jaeger_spans(trace_id)) != expected and time.monotonic() < deadline:
            time.sleep(0.1)  # Jaeger stores what it received asynchronously
        assert found == expected


def _jaeger_spans(trace_id: str) -> set[tuple[str, str, str]]:
    """(span id, parent id, name) of each span Jaeger's query API has of ``trace_id``."""
    try:
        with urllib.request.urlopen(f"{JAEGER}/api/traces/{trace_id}", timeout=2) as r:  # noqa: S310
            data = json.load(r)["data"]
    except OSError:
        return set()
    out = set()
    for span in data[0]["spans"] if data else []:
        parents = [r["spanID"] for r in span["references"] if r["refType"] == "CHILD_OF"]
        out.add((span["spanID"], parents[0] if parents else "", span["operationName"]))
    return out


@pytest.mark.parametrize(
    ("tracestate", "carried"),
    [
        ("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"),
        ("bad key=1", None),  # not the W3C list grammar: discarded
        ("a=" + "x" * 600, None),  # over 512 characters: discarded
    ],
    ids=["valid", "malformed", "oversized"],
)
async def test_the_providers_tracestate_travels_with_the_event(
    tmp_path: Path,
    sqlite_store: SqliteLogStore,
    transport: Transport,
    unique: str,
    traced: OtlpReceiver,
    tracestate: str,
    carried: str | None,
) -> None:
    """A valid ``tracestate`` sent with the ``traceparent`` is carried by the produced event."""
    topic = f"tracestate_{unique}"
    await make_topic(transport, topic, 1)
    sources = build(tmp_path, {"whatsapp": {**META, "topic": topic, "routes": []}}, {topic: topic})
    producer = transport.producer()
    dispatcher = Dispatcher(producer, sqlite_store)
    _, http = client(sources, sqlite_store, dispatcher)
    body = meta_body(1)
    headers = {
        "x-hub-signature-256": hub_signature(SECRET, body),
        "traceparent": f"00-{uuid.uuid4().hex}-{PROVIDER_SPAN}-01",
        "tracestate": tracestate,
    }
    async with http:
        answer = await http.post("/hooks/whatsapp", content=body, headers=headers)
        assert answer.json()["status"] == "accepted"
    consumer = transport.consumer(f"g-{unique}", [topic])
    try:
        (event,) = await consume_until(consumer, lambda got: len(got) >= 1)
    finally:
        await consumer.close()
        await dispatcher.close()
        await producer.close()
        await transport.admin().delete_group(f"g-{unique}", [topic])
    assert event.headers["traceparent"].decode().split("-")[1] == headers["traceparent"][3:35]
    got = event.headers.get("tracestate")
    assert (got.decode() if got is not None else None) == carried
