"""Produce-and-consume throughput of our transports against the raw client loop on the same broker.

Method
------
For each transport (Kafka, Redis Streams) the benchmark runs interleaved pairs ``ours, raw, ours,
raw, ...`` (``--pairs``, default 3) in one process against the same broker, after one discarded
warm-up pair of 2,000 messages. Every run moves ``--messages`` (default 20,000) messages of 1 KiB
(constant bytes) with keys ``k0..k999`` through a fresh, uuid-named topic of 4 partitions, created
through our Admin and deleted afterwards (the raw Redis run uses its own uuid-named stream keys).

* **ours**: windows of 1,000 messages, each produced with one ``producer.send_many(...)``
  (``--produce-api send_many``, the default, the batch API a bursting caller uses) or as an
  ``asyncio.gather`` of 1,000 ``producer.send(...)`` (``--produce-api send``), then one
  ``transport.consumer(group, [topic])`` polling ``poll(500, 1.0)`` and committing
  ``Position(tp, last_offset + 1)`` per partition after every batch, until all are received.
* **raw Kafka**: ``confluent_kafka.Producer`` with the producer's important settings (acks=all,
  idempotence, linger.ms=2, murmur2_random) doing ``produce()`` + ``poll(0)`` and a final
  ``flush()``; then a ``confluent_kafka.Consumer`` (new group, earliest, manual commit) looping
  ``consume(500, 1.0)`` with a synchronous commit of the batch's offsets after every batch.
* **raw Redis**: redis-py asyncio, ``XADD`` in pipelines of 1,000 to the 4 streams (partition by
  murmur2 :func:`~pipeline.transport.partitioner.partition_for`), then ``XREADGROUP COUNT 500
  BLOCK 1000`` over the 4 streams and one pipelined ``XACK`` of the batch per poll.

The timed span is produce + consume, end to end (first send to last commit), reported as
messages per second. Joining the consumer group is not timed, on either side: each consumer joins
(polls until it owns the partitions; ``XGROUP CREATE`` for raw Redis) on the still-empty topic
before the clock starts, because a group join costs a fixed ~0.2-1 s that says nothing about
throughput. Process CPU time (``getrusage``, every thread, so librdkafka's too) over the same span
is reported as CPU-seconds per 10k messages.

Each pair gives a ratio ours/raw; the headline figure per transport is the median of the per-pair
ratios (never a ratio of figures from different runs). The last line printed is one JSON object::

    {"bench": "transport", "kafka_ratio": ..., "redis_ratio": ..., ...}

Brokers come from the usual settings (``PIPELINE_KAFKA__BOOTSTRAP_SERVERS``,
``PIPELINE_REDIS__URL``); the script exits non-zero with a message if one cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common import BenchError, cpu_s
from confluent_kafka import Consumer as RawKafkaConsumer
from confluent_kafka import KafkaException
from confluent_kafka import Producer as RawKafkaProducer
from confluent_kafka import TopicPartition as RawTopicPartition
from confluent_kafka.admin import AdminClient
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from pipeline.config import Settings, load_settings
from pipeline.envelope import Position, Record, TopicPartition
from pipeline.errors import PipelineError, TransportError
from pipeline.transport import create_transport
from pipeline.transport.partitioner import partition_for
from pipeline.transport.protocol import Consumer, Producer, TopicConfig, Transport

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

VALUE = b"x" * 1024
KEYS = [f"k{i}".encode() for i in range(1000)]
PARTITIONS = 4
WINDOW = 1000  # sends per asyncio.gather burst; XADDs per raw pipeline
POLL_MAX = 500
POLL_TIMEOUT_S = 1.0
WARMUP_MESSAGES = 2000
PHASE_TIMEOUT_S = 120.0
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Run:
    """One timed run: N messages produced then consumed."""

    messages: int
    produce_s: float
    consume_s: float
    cpu_s: float

    @property
    def seconds(self) -> float:
        """Produce + consume wall time."""
        return self.produce_s + self.consume_s

    @property
    def msgs_s(self) -> float:
        """End-to-end throughput."""
        return self.messages / self.seconds

    @property
    def cpu_per_10k(self) -> float:
        """Process CPU-seconds per 10,000 messages."""
        return self.cpu_s * 10_000 / self.messages


class Clock:
    """Wall time and process CPU time (all threads) since creation, with one produce lap."""

    def __init__(self) -> None:
        """Start now."""
        self._cpu0 = cpu_s()
        self._t0 = time.perf_counter()
        self._lap: float | None = None

    def lap(self) -> None:
        """Mark the end of the produce phase."""
        self._lap = time.perf_counter()

    def stop(self, messages: int) -> Run:
        """End the consume phase and return the run."""
        end = time.perf_counter()
        cpu = cpu_s() - self._cpu0
        lap = self._lap if self._lap is not None else end
        return Run(messages, lap - self._t0, end - lap, cpu)


def _key(i: int) -> bytes:
    return KEYS[i % len(KEYS)]


def _name(kind: str) -> str:
    return f"bench-{kind}-{uuid.uuid4().hex}"


# -- ours: the same code path for both transports ---------------------------------------------


async def _join(consumer: Consumer) -> None:
    """Poll the empty topic until the member owns partitions (untimed group join)."""
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while not consumer.assignment():
        if await consumer.poll(POLL_MAX, 0.05):
            raise BenchError("the fresh topic is not empty")
        if time.monotonic() > deadline:
            raise BenchError("consumer got no partitions")


PRODUCE_API = {"api": "send_many"}  # set from --produce-api


async def _produce_ours(producer: Producer, topic: str, n: int) -> None:
    for start in range(0, n, WINDOW):
        window = range(start, min(n, start + WINDOW))
        if PRODUCE_API["api"] == "send_many":
            await producer.send_many(topic, [Record(VALUE, _key(i)) for i in window])
        else:
            await asyncio.gather(*(producer.send(topic, VALUE, key=_key(i)) for i in window))


async def _consume_ours(consumer: Consumer, n: int) -> None:
    received = 0
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while received < n:
        batch = await consumer.poll(POLL_MAX, POLL_TIMEOUT_S)
        if not batch:
            if time.monotonic() > deadline:
                raise BenchError(f"ours: received {received} of {n} messages")
            continue
        last: dict[tuple[str, int], int] = {}
        for msg in batch:
            last[msg.topic, msg.partition] = msg.offset
        await consumer.commit([Position(TopicPartition(*tp), off + 1) for tp, off in last.items()])
        received += len(batch)


async def run_ours(transport: Transport, topic: str, group: str, n: int) -> Run:
    """Produce ``n`` through our producer, then consume and commit them through our consumer."""
    producer = transport.producer()
    consumer = transport.consumer(group, [topic])
    try:
        await _join(consumer)
        clock = Clock()
        await _produce_ours(producer, topic, n)
        clock.lap()
        await _consume_ours(consumer, n)
        return clock.stop(n)
    finally:
        await consumer.close()
        await producer.close()


@contextlib.asynccontextmanager
async def fresh_topic(
    transport: Transport, ready: Callable[[str], Awaitable[None]] | None = None
) -> AsyncIterator[tuple[str, str]]:
    """A new uuid-named topic of PARTITIONS partitions and a group name; both deleted after."""
    topic, group = _name(transport.name), _name("group")
    admin = transport.admin()
    await admin.create_topic(TopicConfig(topic, PARTITIONS))
    try:
        if ready is not None:
            await ready(topic)
        yield topic, group
    finally:
        try:
            await admin.delete_group(group, [topic])
        except TransportError as exc:  # cleanup only: report, do not fail the run
            print(f"warning: could not delete group {group}: {exc}", file=sys.stderr)
        await admin.delete_topic(topic)
        await admin.close()


# -- Kafka ---------------------------------------------------------------------------------------


class KafkaBench:
    """Our Kafka transport against confluent-kafka's own loop."""

    name = "kafka"

    def __init__(self, settings: Settings) -> None:
        """Use the broker of ``settings.kafka``."""
        self._bootstrap = settings.kafka.bootstrap_servers
        self._transport = create_transport(settings, "kafka")
        self._raw_admin = AdminClient({"bootstrap.servers": self._bootstrap, "log_level": 0})

    async def probe(self) -> None:
        """Raise BenchError if the broker cannot be reached."""
        try:
            await asyncio.to_thread(self._raw_admin.list_topics, None, PROBE_TIMEOUT_S)
        except KafkaException as exc:
            raise BenchError(
                f"Kafka broker unreachable at {self._bootstrap} "
                f"(PIPELINE_KAFKA__BOOTSTRAP_SERVERS): {exc.args[0]}"
            ) from exc

    async def _ready(self, topic: str) -> None:
        await asyncio.to_thread(self._wait_leaders, topic)

    def _wait_leaders(self, topic: str) -> None:
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while time.monotonic() < deadline:
            found = self._raw_admin.list_topics(topic, PROBE_TIMEOUT_S).topics.get(topic)
            if (
                found is not None
                and found.error is None
                and len(found.partitions) == PARTITIONS
                and all(p.leader >= 0 for p in found.partitions.values())
            ):
                return
            time.sleep(0.05)
        raise BenchError(f"topic {topic} has no leaders")

    async def ours(self, n: int) -> Run:
        """Our producer and consumer."""
        async with fresh_topic(self._transport, self._ready) as (topic, group):
            return await run_ours(self._transport, topic, group, n)

    async def raw(self, n: int) -> Run:
        """confluent-kafka directly (blocking; run on a worker thread)."""
        async with fresh_topic(self._transport, self._ready) as (topic, group):
            return await asyncio.to_thread(self._raw_sync, topic, group, n)

    def _raw_sync(self, topic: str, group: str, n: int) -> Run:
        failed: list[Any] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(err)

        producer = RawKafkaProducer(
            {
                "bootstrap.servers": self._bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "partitioner": "murmur2_random",
                "on_delivery": on_delivery,
            }
        )
        consumer = RawKafkaConsumer(
            {
                "bootstrap.servers": self._bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
            }
        )
        try:
            _raw_join(consumer, topic)
            clock = Clock()
            for i in range(n):
                while True:
                    try:
                        producer.produce(topic, VALUE, key=_key(i))
                        break
                    except BufferError:
                        producer.poll(0.05)
                producer.poll(0)
            if producer.flush(PHASE_TIMEOUT_S) or failed:
                raise BenchError(f"raw kafka: {len(failed)} deliveries failed: {failed[:3]}")
            clock.lap()
            _raw_consume(consumer, topic, n)
            return clock.stop(n)
        finally:
            consumer.close()

    async def close(self) -> None:
        """Release the transport."""
        await self._transport.close()


def _raw_join(consumer: RawKafkaConsumer, topic: str) -> None:
    """Subscribe and poll the empty topic until partitions are assigned (untimed, as for ours)."""
    assigned: list[Any] = []
    consumer.subscribe([topic], on_assign=lambda _c, parts: assigned.extend(parts))
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while not assigned:
        if consumer.consume(POLL_MAX, 0.05) or time.monotonic() > deadline:
            raise BenchError("raw kafka consumer could not join on an empty topic")


def _raw_consume(consumer: RawKafkaConsumer, topic: str, n: int) -> None:
    """consume(500, 1.0) and synchronously commit each batch's offsets until ``n`` arrived."""
    received = 0
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while received < n:
        batch = consumer.consume(POLL_MAX, POLL_TIMEOUT_S)
        last: dict[int, int] = {}
        for msg in batch:
            partition, offset = msg.partition(), msg.offset()
            if msg.error() is not None or partition is None or offset is None:
                raise BenchError(f"raw kafka consume: {msg.error()}")
            last[partition] = offset
        if last:
            consumer.commit(
                offsets=[RawTopicPartition(topic, p, o + 1) for p, o in last.items()],
                asynchronous=False,
            )
        received += len(batch)
        if not batch and time.monotonic() > deadline:
            raise BenchError(f"raw kafka: received {received} of {n} messages")


# -- Redis Streams -------------------------------------------------------------------------------


class RedisBench:
    """Our Redis Streams transport against a pipelined redis-py loop."""

    name = "redis"

    def __init__(self, settings: Settings) -> None:
        """Use the server of ``settings.redis``."""
        self._url = settings.redis.url
        self._transport = create_transport(settings, "redis")
        self._client = Redis.from_url(
            self._url, socket_connect_timeout=PROBE_TIMEOUT_S, socket_timeout=PHASE_TIMEOUT_S
        )

    async def probe(self) -> None:
        """Raise BenchError if Redis cannot be reached."""
        try:
            await self._client.ping()
        except (redis_errors.RedisError, OSError) as exc:
            raise BenchError(
                f"Redis unreachable at {self._url} (PIPELINE_REDIS__URL): {exc}"
            ) from exc

    async def ours(self, n: int) -> Run:
        """Our producer and consumer on a fresh topic, deleted afterwards with its group."""
        async with fresh_topic(self._transport) as (topic, group):
            return await run_ours(self._transport, topic, group, n)

    async def raw(self, n: int) -> Run:
        """Pipelined XADD, then XREADGROUP + XACK, on uuid-named streams deleted afterwards."""
        base = _name("raw")
        streams = [f"{base}:{p}" for p in range(PARTITIONS)]
        group, member = "bench", "c1"
        client = self._client
        try:
            for stream in streams:  # untimed "join", as for ours
                await client.xgroup_create(stream, group, id="0", mkstream=True)

            clock = Clock()
            for start in range(0, n, WINDOW):
                pipe = client.pipeline(transaction=False)
                for i in range(start, min(n, start + WINDOW)):
                    key = _key(i)
                    pipe.xadd(streams[partition_for(key, PARTITIONS)], {"k": key, "v": VALUE})
                await pipe.execute()
            clock.lap()

            received = 0
            deadline = time.monotonic() + PHASE_TIMEOUT_S
            block_ms = int(POLL_TIMEOUT_S * 1000)
            while received < n:
                reply: Any = await client.xreadgroup(
                    group, member, dict.fromkeys(streams, ">"), count=POLL_MAX, block=block_ms
                )
                if not reply:
                    if time.monotonic() > deadline:
                        raise BenchError(f"raw redis: received {received} of {n} messages")
                    continue
                pipe = client.pipeline(transaction=False)
                for stream, entries in reply:
                    pipe.xack(stream, group, *(entry_id for entry_id, _ in entries))
                    received += len(entries)
                await pipe.execute()
            return clock.stop(n)
        finally:
            await client.delete(*streams)

    async def close(self) -> None:
        """Release the transport and the raw client."""
        await self._transport.close()
        await self._client.aclose()


# -- driver --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Result:
    """The interleaved pairs of one transport."""

    transport: str
    ours: list[Run]
    raw: list[Run]

    @property
    def ratios(self) -> list[float]:
        """ours/raw throughput per pair."""
        return [o.msgs_s / r.msgs_s for o, r in zip(self.ours, self.raw, strict=True)]

    @property
    def ratio(self) -> float:
        """Median of the per-pair ratios."""
        return statistics.median(self.ratios)


async def bench_pairs(bench: KafkaBench | RedisBench, pairs: int, messages: int) -> Result:
    """One discarded warm-up pair, then ``pairs`` interleaved (ours, raw) pairs."""
    await bench.ours(min(messages, WARMUP_MESSAGES))
    await bench.raw(min(messages, WARMUP_MESSAGES))
    ours: list[Run] = []
    raw: list[Run] = []
    for i in range(pairs):
        ours.append(await bench.ours(messages))
        raw.append(await bench.raw(messages))
        print(
            f"  {bench.name} pair {i + 1}/{pairs}: ours {ours[-1].msgs_s:,.0f} msgs/s, "
            f"raw {raw[-1].msgs_s:,.0f} msgs/s",
            file=sys.stderr,
            flush=True,
        )
    return Result(bench.name, ours, raw)


def _median(runs: Sequence[Run], metric: Callable[[Run], float]) -> float:
    return statistics.median(metric(r) for r in runs)


_COLUMNS = (
    "ours",
    "raw",
    "ratio",
    "prod ours",
    "prod raw",
    "cons ours",
    "cons raw",
    "cpu ours",
    "cpu raw",
)


def _row(label: str, ours: Sequence[Run], raw: Sequence[Run], ratio: float) -> str:
    cells = [
        f"{_median(ours, lambda r: r.msgs_s):,.0f}",
        f"{_median(raw, lambda r: r.msgs_s):,.0f}",
        f"{ratio:.2f}",
        f"{_median(ours, lambda r: r.messages / r.produce_s):,.0f}",
        f"{_median(raw, lambda r: r.messages / r.produce_s):,.0f}",
        f"{_median(ours, lambda r: r.messages / r.consume_s):,.0f}",
        f"{_median(raw, lambda r: r.messages / r.consume_s):,.0f}",
        f"{_median(ours, lambda r: r.cpu_per_10k):.2f}",
        f"{_median(raw, lambda r: r.cpu_per_10k):.2f}",
    ]
    return f"{label:>6}" + "".join(f"{cell:>10}" for cell in cells)


def print_table(result: Result) -> None:
    """A small human-readable table of one transport's pairs.

    ``ours``/``raw``: end-to-end msgs/s; ``prod``/``cons``: msgs/s of each phase alone;
    ``cpu``: process CPU-seconds per 10k messages.
    """
    print(f"\n{result.transport}: produce+consume, {result.ours[0].messages:,} x 1 KiB messages")
    print(f"{'pair':>6}" + "".join(f"{col:>10}" for col in _COLUMNS))
    rows = zip(result.ours, result.raw, result.ratios, strict=True)
    for i, (ours, raw, ratio) in enumerate(rows, 1):
        print(_row(str(i), [ours], [raw], ratio))
    print(_row("median", result.ours, result.raw, result.ratio))


def summary(results: Sequence[Result], pairs: int, messages: int) -> dict[str, Any]:
    """The machine-readable result (the last line of output)."""
    out: dict[str, Any] = {"bench": "transport", "kafka_ratio": None, "redis_ratio": None}
    for res in results:
        t = res.transport
        out[f"{t}_ratio"] = round(res.ratio, 3)
        out[f"{t}_ratios"] = [round(x, 3) for x in res.ratios]
        out[f"{t}_ours_msgs_s"] = round(_median(res.ours, lambda r: r.msgs_s))
        out[f"{t}_raw_msgs_s"] = round(_median(res.raw, lambda r: r.msgs_s))
        out[f"{t}_ours_cpu_s_per_10k"] = round(_median(res.ours, lambda r: r.cpu_per_10k), 3)
        out[f"{t}_raw_cpu_s_per_10k"] = round(_median(res.raw, lambda r: r.cpu_per_10k), 3)
    out |= {
        "pairs": pairs,
        "messages": messages,
        "produce_api": PRODUCE_API["api"],
        "message_bytes": len(VALUE),
        "partitions": PARTITIONS,
    }
    return out


async def run(transports: Sequence[str], pairs: int, messages: int) -> list[Result]:
    """Probe every selected broker first, then bench each transport in turn."""
    settings = load_settings()
    benches: list[KafkaBench | RedisBench] = []
    try:
        for name in transports:
            bench: KafkaBench | RedisBench = (
                KafkaBench(settings) if name == "kafka" else RedisBench(settings)
            )
            benches.append(bench)
            await bench.probe()
        return [await bench_pairs(bench, pairs, messages) for bench in benches]
    finally:
        for bench in benches:
            await bench.close()


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run, print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--transport", choices=["kafka", "redis", "both"], default="both")
    parser.add_argument("--pairs", type=_positive, default=3, help="interleaved (ours, raw) pairs")
    parser.add_argument(
        "--messages", type=_positive, default=20_000, help="messages per run (each side)"
    )
    parser.add_argument(
        "--produce-api",
        choices=["send_many", "send"],
        default="send_many",
        help="ours produces each window with one send_many (default) or a gather of sends",
    )
    args = parser.parse_args(argv)
    PRODUCE_API["api"] = args.produce_api
    transports = ["kafka", "redis"] if args.transport == "both" else [args.transport]
    try:
        results = asyncio.run(run(transports, args.pairs, args.messages))
    except (BenchError, PipelineError, KafkaException, redis_errors.RedisError, OSError) as exc:
        print(f"bench/transport.py: error: {exc}", file=sys.stderr)
        return 1
    for result in results:
        print_table(result)
    print()
    print(json.dumps(summary(results, args.pairs, args.messages)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
