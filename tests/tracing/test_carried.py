"""The trace context kept with a log row comes back with every produce of it (SQLite, PostgreSQL).

A row stored with a ``traceparent`` (as the ingress stores it) and produced again by the
sweeper's and the replay command's path (:func:`~pipeline.ingress.republish.produce_rows`) is
produced under a ``send`` span whose parent is the stored context, and the event carries that
span's context on.
"""

from __future__ import annotations

import time

from contract.helpers import consume_until, make_topic
from tracing.otlp_receiver import OtlpReceiver

from pipeline import tracing
from pipeline.ingress.republish import produce_rows
from pipeline.logstore import LogStore, NewRow
from pipeline.transport.protocol import Transport

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"


async def test_a_replayed_row_continues_the_trace_it_was_stored_with(
    log_store: LogStore, transport: Transport, unique: str, traced: OtlpReceiver
) -> None:
    """The stored traceparent is the parent of the replay's send span, and travels with it."""
    topic = f"carried-{unique}"
    await make_topic(transport, topic, 1)
    row = NewRow(
        id=f"row-{unique}",
        source="whatsapp",
        tenant="acme",
        key="conv-1",
        topic=topic,
        lane=topic,
        event_id=f"evt-{unique}",
        received_at_ms=int(time.time() * 1000),
        headers={"traceparent": f"00-{TRACE}-{SPAN}-01"},
        body=b"{}",
    )
    assert await log_store.insert(row)
    stored = await log_store.get(row.id)
    assert stored is not None
    assert stored.headers["traceparent"] == f"00-{TRACE}-{SPAN}-01"
    producer = transport.producer()
    produced = await produce_rows(producer, [stored], replay=True)
    await producer.close()
    assert [r.id for r in produced.delivered] == [row.id]
    consumer = transport.consumer(f"g-{unique}", [topic])
    (event,) = await consume_until(consumer, lambda got: len(got) >= 1)
    await consumer.close()
    await transport.admin().delete_group(f"g-{unique}", [topic])
    await transport.admin().delete_topic(topic)
    tracing.shutdown()
    (send,) = traced.traces()[TRACE]
    assert (send.name, send.parent_id, send.kind) == (f"send {topic}", SPAN, "SPAN_KIND_PRODUCER")
    assert event.headers["traceparent"] == f"00-{TRACE}-{send.span_id}-01".encode()
