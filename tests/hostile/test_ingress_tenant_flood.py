"""A flood of webhooks, each of its own tenant, key and event id, leaves nothing in the ingress.

Whoever holds a source's secret decides the tenant, key and event id of every webhook. An
ingress on Kafka and SQLite, served in this process by its own HTTP layer with the sweeper on,
takes a warm-up, then a flood over keep-alive connections: accepted webhooks, redeliveries,
webhooks refused as malformed (a tenant too long) and ones signed with the wrong secret, every
one with values no other had. Once the fast path has produced and marked every row, no object
in the process refers to any of those values (the app's counters, the dispatcher's queues, the
admission slots, the sweeper's lane sets, the metrics, the connections), the counters have one
entry per outcome, and ``/metrics`` has the series it had after the warm-up. The same holds
with tracing on (every request sampled, the spans sent and let go of by the receiver): the
spans' encoders and their caches keep none of the tenants the spans carried.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import FrameType

import pytest
from hostile.flood_webhooks import flood_source, send_in_turn, webhook
from ingress.helpers import built_with_topics, one_lane_ingress
from runtime.helpers import eventually
from tracing.otlp_receiver import OtlpReceiver

from pipeline import tracing
from pipeline.config import SweeperSettings
from pipeline.ingress.service import Ingress, http_server
from pipeline.ingress.values import MAX_VALUE_CHARS

pytestmark = pytest.mark.usefixtures("kafka_service")

CONNECTIONS = 16
WARM_UP = 200
FLOOD = 3_000
SERIES = re.compile(rb"^([^#\s][^\s]*)\s", re.MULTILINE)


def request(run: str, n: int) -> bytes:
    """Webhook ``n`` of the mix: accepted, sent twice, refused malformed or unsigned.

    Of every ten: one a redelivery of the webhook before it, one with a tenant too long (400),
    one signed with another secret (401); the others accepted.
    """
    match n % 10:
        case 3:
            return webhook(run, n - 1)
        case 5:
            return webhook(run, n, tenant=f"tenant-{run}-{n}-" + "x" * MAX_VALUE_CHARS)
        case 7:
            return webhook(run, n, secret="not-the-secret")  # noqa: S106 - a wrong one
        case _:
            return webhook(run, n)


async def send(port: int, run: str, numbers: range) -> dict[int, int]:
    """Send webhooks ``numbers`` over :data:`CONNECTIONS` keep-alive connections; statuses."""
    statuses: dict[int, int] = {}

    # A block of ten goes on one connection: a redelivery comes after its original.
    await asyncio.gather(
        *(
            send_in_turn(
                port, [request(run, n) for n in numbers if n // 10 % CONNECTIONS == c], statuses
            )
            for c in range(CONNECTIONS)
        )
    )
    return statuses


@asynccontextmanager
async def serving(tmp_path: Path, run: str) -> AsyncIterator[tuple[Ingress, int]]:
    """An ingress on Kafka (a topic of its own) and SQLite, served here; its port."""
    topic = f"tenants-{run}"
    declaration = {"name": topic, "partitions": 2, "lane": f"tenants_{run}"}
    source = flood_source(topic)
    sweeping = SweeperSettings(interval_s=0.5)
    settings, config = one_lane_ingress(
        tmp_path, declaration, {"flood": source}, transport="kafka", sweeper=sweeping
    )
    built = await built_with_topics(settings, config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = http_server(built, "127.0.0.1", sock.getsockname()[1])
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await eventually(lambda: server.started)
        yield built, sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task
        sock.close()


def holders(pattern: re.Pattern[str]) -> Iterator[str]:
    """The types of the objects referring to a string (or bytes) ``pattern`` finds in."""
    gc.collect()
    for obj in gc.get_objects():
        if isinstance(obj, FrameType):
            continue
        for ref in gc.get_referents(obj):
            if isinstance(ref, bytes):
                ref = ref.decode("latin-1")  # noqa: PLW2901 - searched as text
            if isinstance(ref, str) and pattern.search(ref):
                yield f"{type(obj).__module__}.{type(obj).__qualname__}: {ref[:80]!r}"
                break


async def drained(built: Ingress) -> None:
    """Wait until the fast path produced and marked every accepted row."""
    dispatcher = built.dispatcher
    assert dispatcher is not None
    await eventually(lambda: dispatcher.waiting == 0 and dispatcher._marker is None)


async def series(built: Ingress) -> set[bytes]:
    """The names and labels of every series ``/metrics`` shows, refreshed now."""
    await built.observer.refresh_once()
    return set(SERIES.findall(built.observer.snapshot))


async def flood_leaves_nothing(tmp_path: Path, traced: OtlpReceiver | None = None) -> None:
    """Warm up, flood, then check that nothing keeps a flooded value (the test's assertions).

    ``traced``: where tracing exports; the flood's spans are waited for, then let go of there.
    """
    run = uuid.uuid4().hex[:10]
    async with serving(tmp_path, run) as (built, port):
        warm_up = await send(port, f"w{run}", range(WARM_UP))
        assert warm_up.keys() == {200, 400, 401}, warm_up
        await drained(built)
        before = await series(built)

        statuses = await send(port, run, range(FLOOD))
        await drained(built)
        after = await series(built)
        if traced is not None:
            await eventually(lambda: len(tenants(traced, run)) == FLOOD * 7 // 10)
            traced.let_go()  # a batch exported after these is answered, not kept by the test

        assert statuses == {200: FLOOD * 8 // 10, 400: FLOOD // 10, 401: FLOOD // 10}
        left = list(holders(re.compile(rf"(tenant|key)-{run}-|wamid\.{run}\.")))
        assert left == [], f"{len(left)} objects keep a flood's values, such as {left[:5]}"
        assert set(built.app.counters) == {
            ("flood", "accepted"),
            ("flood", "duplicate"),
            ("flood", "malformed:tenant too long"),
            ("flood", "rejected:signature mismatch"),
        }
        assert after == before, f"new series: {sorted(after - before)[:10]}"


def tenants(receiver: OtlpReceiver, run: str) -> set[str]:
    """The flood's tenants the spans ``receiver`` got carry."""
    with receiver._lock:
        values = {span.attributes.get("pipeline.tenant", "") for span in receiver.spans}
    return {value for value in values if value.startswith(f"tenant-{run}-")}


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """Tracing on, every request sampled, exporting to a receiver of the test's own."""
    receiver = OtlpReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    # Every span is waited for: none may be dropped when a loaded machine exports slowly.
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", str(10 * FLOOD))
    assert tracing.configure(os.environ, service="pipeline-ingress")
    try:
        yield receiver
    finally:
        tracing.shutdown()
        receiver.close()


async def test_a_flood_of_tenants_leaves_no_entry_behind(tmp_path: Path) -> None:
    """Every flooded value is let go once done; counters and series do not grow per tenant."""
    await flood_leaves_nothing(tmp_path)


async def test_a_traced_flood_of_tenants_leaves_no_entry_behind(
    tmp_path: Path, traced: OtlpReceiver
) -> None:
    """With tracing on too: the spans' encoders keep no tenant once the spans are sent."""
    await flood_leaves_nothing(tmp_path, traced)
