"""The exporting process's own OTLP encoding says exactly what the SDK's encoder says.

The same records (a delivery, a webhook request and a send with every optional part and in
each of their other shapes, a failed span with events and links, attributes of every type) go
through both paths of ``pipeline.tracing.export``: the SDK's spans encoded by the SDK, and the
wire format of :mod:`pipeline.tracing.otlp`, :mod:`pipeline.tracing.wire_delivery` and
:mod:`pipeline.tracing.wire_ingress`. Both requests are decoded with ``opentelemetry-proto``
and must hold the same spans, field by field.
"""

from __future__ import annotations

import itertools
import random

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource

from pipeline.tracing import otlp
from pipeline.tracing.export import SCOPE, Spans, WireSpans
from pipeline.tracing.record import DELIVERY, SEND, SPAN, WEBHOOK, Record

TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
T0 = 1_764_590_000_000_000_000


def records() -> list[Record]:
    """Records of every kind, with their optional parts.

    A delivery with throttle wait, guard, failed handler and events; a linked, failed span; a
    webhook with a failed stage; a send with a key and a failed one without.
    """
    failure = ("RuntimeError", ("exception", T0 + 9, {"exception.type": "RuntimeError"}))
    delivery = (
        DELIVERY,
        (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7),
        T0 - 5_000,
        T0,
        T0 + 3,
        ("tenant-a", "key-1"),
        2,
        0x1111,
        T0 + 4,
        T0 + 20,
        T0 + 5,
        T0 + 9,
        failure,
        T0 + 30,
        *("kafka", "orders", 3, 41, "orders", "replies", b"2", 1, b"tenant-a", b"key-1"),
        "retried",
        [("retried", T0 + 30, None)],
        [("dead_letter_reason", T0 + 10, {"pipeline.detail": "poison"})],
    )
    span = (
        SPAN,
        0x0AF7651916CD43DD8448EB211C80319C,
        0x2222,
        0,
        "POST /hooks/whatsapp",
        "server",
        T0,
        T0 + 100,
        {"http.route": "/hooks/{source}", "ok": True, "n": -3, "ratio": 0.5, "keys": ["a", "b"]},
        [("exception", T0 + 50, {"exception.message": "bad"})],
        [(0x0AF7651916CD43DD8448EB211C80319D, 0x3333)],
        "Rejected",
    )
    webhook = (
        WEBHOOK,
        0x0AF7651916CD43DD8448EB211C80319C,
        0x4444,
        0x5555,
        "whatsapp",
        T0,
        T0 + 200,
        {"pipeline.tenant": "tenant-a"},
        None,
        None,
        [
            (
                "verify",
                T0 + 1,
                T0 + 2,
                "Rejected",
                [("exception", T0 + 2, {"exception.type": "R"})],
            ),
            ("log commit", T0 + 3, T0 + 150, None, None),
        ],
    )
    sends = [
        (
            SEND,
            (0x0AF7651916CD43DD8448EB211C80319C, 0x4444),
            0x6666,
            "kafka",
            "orders",
            b"k-1",
            T0 + 160,
            T0 + 190,
            None,
            None,
        ),
        (
            SEND,
            (0x0AF7651916CD43DD8448EB211C80319C, 0x4444),
            0x7777,
            "redis",
            "orders",
            None,
            T0 + 160,
            T0 + 195,
            "KafkaError",
            [("exception", T0 + 195, {"exception.type": "K"})],
        ),
    ]
    return [delivery, span, webhook, *sends]


def _spans(body: bytes, made_here: frozenset[str] = frozenset()) -> list[dict[str, object]]:
    """The request's spans as dicts; span ids made at random are replaced by span names.

    ``made_here``: more spans whose ids the exporting process makes for this record.
    """
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    (resource_spans,) = request.resource_spans
    (scope_spans,) = resource_spans.scope_spans
    docs = [MessageToDict(span) for span in scope_spans.spans]
    names = {doc["spanId"]: doc["name"] for doc in docs}
    for doc in docs:
        doc.pop("flags", None)  # the SDK also says whether the parent is remote; we do not
        if doc.get("status") == {}:
            del doc["status"]  # unset, said or not
        for link in doc.get("links", []):
            link.pop("flags", None)
        if doc["name"] in RANDOM_IDS or doc["name"] in made_here:
            del doc["spanId"]
        parent = doc.get("parentSpanId")
        if parent in names:
            doc["parentSpanId"] = names[parent]
    return docs


RANDOM_IDS = {
    "partition wait",
    "process orders",
    "throttle wait",
    "handler",
    "verify",
    "log commit",
}
"""Spans whose ids the exporting process makes (each encoding its own)."""


def test_the_wire_encoding_matches_the_sdk_encoder() -> None:
    """Same names, kinds, ids, parents, times, attributes, events, links and status."""
    resource = Resource.create({"service.name": "pipeline-test"})
    sdk_spans = [s for r in records() for s in Spans(resource).of(r)]
    wire_spans = [s for r in records() for s in WireSpans(resource).of(r)]
    ours = otlp.request(resource.attributes, SCOPE, wire_spans)
    theirs = encode_spans(sdk_spans).SerializeToString()
    assert [s["name"] for s in _spans(ours)] == [
        "partition wait",
        "process orders",
        "throttle wait",
        "guard",
        "handler",
        "POST /hooks/whatsapp",
        "verify",
        "log commit",
        "POST /hooks/whatsapp",
        "send orders",
        "send orders",
    ]
    assert _spans(ours) == _spans(theirs)
    request = ExportTraceServiceRequest()
    request.ParseFromString(ours)
    resource_spans = request.resource_spans[0]
    assert {a.key for a in resource_spans.resource.attributes} >= {"service.name"}
    assert resource_spans.scope_spans[0].scope.name == SCOPE


def test_varints_of_every_size_and_negative_int64() -> None:
    """Varints decode back as protobuf does (negative int64 as ten bytes)."""
    edges = (2**14 - 1, 2**14, 2**21 - 1, 2**21, 2**21 + 5, 2**28 - 1, 2**28, 2**35, 2**63 - 1)
    for value in itertools.chain(range(300), range(2**14 - 3, 2**14 + 300, 7), edges):
        raw = otlp.varint(value)
        decoded, shift = 0, 0
        for byte in raw:
            decoded |= (byte & 0x7F) << shift
            shift += 7
        assert decoded == value
    assert len(otlp.varint(-1)) == 10


def _delivery(**changes: object) -> Record:
    """The delivery of :func:`records` with some of its fields changed (by name)."""
    fields = [
        *("kind", "carried", "produced", "entered", "admitted", "keys", "priority"),
        *("guard_id", "guard_start", "guard_end", "handler_start", "handler_end", "failure"),
        *("end", "system", "topic", "partition", "offset", "lane", "group", "attempt", "count"),
        *("tenant", "key", "outcome", "events", "guard_events"),
    ]
    values = dict(zip(fields, records()[0], strict=True))
    unknown = set(changes) - set(fields)
    assert not unknown, unknown
    values.update(changes)
    return tuple(values[name] for name in fields)


DELIVERY_VARIANTS = {
    "traceparent as it came": _delivery(carried=TRACEPARENT),
    "traceparent as text": _delivery(carried=TRACEPARENT.decode()),
    "traceparent in capitals": _delivery(carried=TRACEPARENT.upper()),
    "traceparent with flags that are not hex": _delivery(carried=TRACEPARENT[:-2] + b"0x"),
    "traceparent of version ff": _delivery(carried=b"ff" + TRACEPARENT[2:]),
    "traceparent with a zero trace id": _delivery(carried=b"00-" + b"0" * 32 + TRACEPARENT[35:]),
    "traceparent with a zero parent": _delivery(carried=TRACEPARENT[:36] + b"0" * 16 + b"-01"),
    "traceparent with a dash moved": _delivery(carried=TRACEPARENT[:34] + b"--" + TRACEPARENT[36:]),
    "key longer than one length byte": _delivery(key=b"k" * 300),
    "no traceparent": _delivery(carried=None),
    "malformed traceparent": _delivery(carried=b"00-not-a-traceparent"),
    "redis, no offset attribute": _delivery(system="redis", offset=7, partition=0),
    "no key, no tenant, first attempt": _delivery(key=None, tenant=None, attempt=None),
    "attempt not a number": _delivery(attempt=b"two"),
    "unrouted": _delivery(outcome=None, events=None),
    "no throttle, guard id made here": _delivery(keys=None, admitted=0, guard_id=0),
    "no guard": _delivery(guard_id=0, guard_start=0, guard_end=0, guard_events=None),
    "guard still open at the end": _delivery(guard_end=0),
    "not produced here": _delivery(produced=0),
    "handler not run": _delivery(handler_start=0, handler_end=0, failure=None),
    "handler succeeded": _delivery(failure=None, outcome="handled", events=[]),
    "key and tenant not UTF-8": _delivery(key=b"\xff\xfe", tenant=b"\xc3"),
    "offset of many bytes": _delivery(offset=2**40 + 3, partition=130),
    "admitted before it entered": _delivery(admitted=T0 - 10),
    "no consumer group": _delivery(group=""),
    "a consumer group name not ASCII": _delivery(group="réponses"),
}


def test_every_shape_of_delivery_is_written_as_the_sdk_writes_it() -> None:
    """The delivery encoder's parts kept per partition and lane change nothing in the output."""
    resource = Resource.create({"service.name": "pipeline-test"})
    for label, record in DELIVERY_VARIANTS.items():
        state = random.getstate()
        sdk_spans = list(Spans(resource).of(record))
        random.setstate(state)  # the same ids made here, for a record that has none
        wire_spans = list(WireSpans(resource).of(record))
        ours = otlp.request(resource.attributes, SCOPE, wire_spans)
        theirs = encode_spans(sdk_spans).SerializeToString()
        made_here = frozenset({"guard"} if not record[7] else ())  # no guard id came with it
        assert _spans(ours, made_here) == _spans(theirs, made_here), label


def _webhook(**changes: object) -> Record:
    """The webhook of :func:`records` with some of its fields changed (by name)."""
    fields = [
        *("kind", "trace_id", "span_id", "parent_id", "source", "start", "end"),
        *("attributes", "events", "error", "stages"),
    ]
    values = dict(zip(fields, records()[2], strict=True))
    assert not set(changes) - set(fields)
    values.update(changes)
    return tuple(values[name] for name in fields)


def _send(index: int = 0, **changes: object) -> Record:
    """A send of :func:`records` with some of its fields changed (by name)."""
    fields = [
        *("kind", "carried", "span_id", "system", "topic", "key"),
        *("start", "end", "error", "events"),
    ]
    values = dict(zip(fields, records()[3 + index], strict=True))
    assert not set(changes) - set(fields)
    values.update(changes)
    return tuple(values[name] for name in fields)


REQUEST_VARIANTS = {
    "a failed stage and a tenant": _webhook(),
    "no parent (a new trace)": _webhook(parent_id=0),
    "no attributes, no stages": _webhook(attributes=None, stages=[]),
    "attributes of every type": _webhook(
        attributes={"pipeline.tenant": "t", "n": -3, "ok": True, "r": 0.5, "keys": ["a", "b"]}
    ),
    "an attribute replacing the route": _webhook(attributes={"http.route": "/other"}),
    "a failed request with events": _webhook(
        error="Rejected", events=[("exception", T0 + 5, {"exception.type": "Rejected"})]
    ),
    "a stage with events and no error": _webhook(
        stages=[("verify", T0 + 1, T0 + 2, None, [("note", T0 + 1, None)])]
    ),
    "a source name of many bytes": _webhook(source="s" * 200),
    "a send with a key": _send(0),
    "a failed send without a key": _send(1),
    "a send with a key that is not UTF-8": _send(0, key=b"\xff\xfe"),
    "a send with a long key": _send(0, key=b"k" * 300),
    "a send without a parent": _send(0, carried=(0x0AF7651916CD43DD8448EB211C80319C, 0)),
    "a send under a traceparent as it came": _send(0, carried=TRACEPARENT),
    "a send over redis with events, no error": _send(
        0, system="redis", events=[("note", T0 + 170, {"a": 1})]
    ),
}


def test_every_shape_of_request_and_send_is_written_as_the_sdk_writes_it() -> None:
    """The request and send encoders' kept parts change nothing in the output."""
    resource = Resource.create({"service.name": "pipeline-test"})
    for label, record in REQUEST_VARIANTS.items():
        state = random.getstate()
        sdk_spans = list(Spans(resource).of(record))
        random.setstate(state)  # the same stage ids made here
        wire_spans = list(WireSpans(resource).of(record))
        ours = otlp.request(resource.attributes, SCOPE, wire_spans)
        theirs = encode_spans(sdk_spans).SerializeToString()
        made_here = frozenset({"guard"} if not record[7] else ())  # no guard id came with it
        assert _spans(ours, made_here) == _spans(theirs, made_here), label
        expected = len(record[10]) + 1 if record[0] == WEBHOOK else 1  # stages and request
        assert len(_spans(ours)) == expected, label


def test_a_batch_is_encoded_as_its_records_one_by_one() -> None:
    """``encoded`` (the exporting process's loop) gives what ``of`` gives record by record."""
    resource = Resource.create({"service.name": "pipeline-test"})
    batch = [*records(), *DELIVERY_VARIANTS.values(), *REQUEST_VARIANTS.values()]
    for kind in (WireSpans, Spans):
        state = random.getstate()
        one_by_one = [span for record in batch for span in kind(resource).of(record)]
        random.setstate(state)
        together = kind(resource).encoded(batch)
        if kind is WireSpans:
            assert together == one_by_one
        else:
            assert [s.name for s in together] == [s.name for s in one_by_one]
