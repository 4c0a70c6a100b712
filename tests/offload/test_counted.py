"""The offload metrics after real offloaded deliveries, read from a Prometheus registry.

Objects written and reused, bytes written, payloads fetched (bytes and a duration), a missing
object and a purge are each counted once, labelled by the store, on both transports and both
stores.
"""

from __future__ import annotations

import hashlib

from offload.helpers import declared, offload_lane
from redis.asyncio import Redis
from runtime.helpers import FAST, eventually, running

from pipeline.observability.facades import OffloadMetrics, RuntimeMetrics
from pipeline.observability.metrics import Metrics
from pipeline.offload import reference as ref
from pipeline.offload.lazy import LazyPayload, read_body
from pipeline.offload.purge import purge
from pipeline.offload.writer import Offloader, OffloadingProducer, topic_policies
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


async def test_writes_fetches_missing_objects_and_purges_are_counted(
    transport: Transport, redis: Redis, store_url: str, unique: str
) -> None:
    """Two sends of one body (written, then reused), a read, a deleted object, a purge."""
    spec = offload_lane(f"metered_{unique}", store_url)
    kept, gone = b"k" * 300_000, b"g" * 400_000
    metrics = Metrics()

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"store": store_url, **labels})

    async with declared(transport, redis, unique, spec):
        offloader = Offloader(topic_policies([spec]), observer=OffloadMetrics(metrics))
        producer = OffloadingProducer(transport.producer(), offloader)
        await producer.send(spec.name, kept, key=b"a")
        await producer.send(spec.name, kept, key=b"a")  # same content: nothing written
        await producer.send(spec.name, gone, key=b"b")
        await producer.close()
        store = offloader.store(store_url)
        await store.delete(ref.key_for(hashlib.sha256(gone).hexdigest()))

        read: list[int] = []
        app = App([spec])

        @app.handler(spec.lane)
        async def handle(event: LazyPayload | bytes, ctx: Context) -> None:
            read.append(len(await read_body(event)))

        group = f"g-{unique}"
        member = Member(
            app,
            transport,
            group,
            FAST,
            redis=redis,
            redis_prefix=unique,
            metrics=RuntimeMetrics(metrics),
        )
        async with running(member):
            await eventually(lambda: member.stats.handled == 2 and member.stats.dead_lettered == 1)
        assert read == [len(kept), len(kept)]
        report = await purge(store, 0, now_s=2**40, observer=OffloadMetrics(metrics))
        await transport.admin().delete_group(group, spec.topic_names())

    assert sample("pipeline_offload_objects_total", outcome="written") == 2
    assert sample("pipeline_offload_objects_total", outcome="reused") == 1
    assert sample("pipeline_offload_written_bytes_total") == len(kept) + len(gone)
    assert sample("pipeline_offload_fetched_bytes_total") == 2 * len(kept)
    assert sample("pipeline_offload_fetch_duration_seconds_count") == 2
    assert sample("pipeline_offload_missing_total") == 1
    assert report.deleted == 1
    assert sample("pipeline_offload_purged_total") == 1
    dead = metrics.registry.get_sample_value(
        "pipeline_dead_letters_total", {"lane": spec.lane, "reason": "payload_missing"}
    )
    assert dead == 1
