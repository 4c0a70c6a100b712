"""The consumer runtime on Kafka: raw client loop, faust, FastStream, and what users run.

Four measurements, all against the same Kafka broker in one run (``make bench-runtime``):

1. **Throughput, no-op handler.** One topic of 12 partitions is created and ``--messages``
   (default 50,000) messages of 1 KiB (constant bytes) with keys ``k0..k999`` are produced into it
   once, untimed. Then, ``--repeats`` times (default 3), four consumers each read all of it with a
   fresh consumer group, in interleaved order (rotated every repeat, so no runner always goes
   first):

   * **ours**: a :class:`~pipeline.runtime.member.Member` (default ``RuntimeSettings``: 64
     concurrent keys, commits every 500 ms, no Redis) on an ordered lane with a no-op
     ``async def handle(event: bytes, ctx)``;
   * **raw**: a ``confluent_kafka.Consumer`` loop: ``consume(500, 1.0)``, a no-op call per message,
     one synchronous ``commit()`` of the batch's offsets per batch (in this process, on a thread);
   * **faust**: a faust-streaming agent with a no-op body, in a subprocess
     (``bench/peers/faust_peer.py``);
   * **faststream**: a FastStream ``KafkaBroker`` subscriber (aiokafka backend) with a no-op
     handler, in a subprocess (``bench/peers/faststream_peer.py``).

   The timed span is the same for all four: from the first message the handler receives to the
   last message handled (for raw: to the end of the last batch's commit). Process start, imports
   and the group join are outside it. Each reports the process CPU time (``getrusage``, every
   thread, librdkafka's and aiokafka's included) over that span as CPU-seconds per 10k. After the
   span each runner gets its commit covering every message (ours: the member's own periodic
   commit; raw: already done; faust and FastStream: one explicit ``commit()``), reported as
   ``commit_s`` and not in the ratio; the harness then checks the group's committed offsets
   reached the end of every partition. The peers run from their own virtualenv,
   ``bench/peers/.venv``, created on demand from ``bench/peers/requirements.txt`` so their pins
   never touch the project's; if it cannot be built or a peer fails, that peer is reported as
   null with a reason. Ratios (``vs_raw`` = ours/raw msgs/s, ...) are computed per repeat and the
   median is reported.

2. **Key parallelism** (Confluent Parallel Consumer's scenario): 10,000 messages, ONE partition,
   100 keys, a handler that awaits ``asyncio.sleep(random.uniform(0, 0.005))``. Our ordered lane
   with ``max_concurrency=100`` against the same member with ``max_concurrency=1``
   (partition-serial), interleaved, ``--repeats`` times; ``key_parallel_speedup`` is the median
   ratio of throughputs. Per-key order is checked in both. A third, diagnostic run per repeat
   raises ``partition_high_water`` above the whole backlog, so flow control never pauses the
   partition (``key_parallel_speedup_no_pause``); it shows what the pause/resume path costs.

3. **Guarded lane against the bare member** (``bench/guarded.py``, ``bench/lane_process.py``):
   what users run against the runtime alone. One Kafka lane of 4 partitions, ordered,
   ``--wire-messages`` (default 100,000: at 60,000-75,000 messages/s, 20,000 made a timed span
   of 0.3 s, too short to tell the runners apart) messages of 1 KiB over 1,000 keys, produced
   once per lane declaration, and a no-op handler (``bench/lane_app.py``) that writes one byte
   per message to a pipe the harness reads and counts. Each consumer is its OWN process, started
   in a fresh directory holding the lane's ``topics/<name>.yaml`` and the app module, on a fresh
   group:

   * **bare**: a :class:`~pipeline.runtime.member.Member` without Redis and without metrics
     (default ``RuntimeSettings``), as ``bench/peers_bench.py``'s bare worker;
   * **consume**: ``pipeline consume bench_lane_app:app --group G``, the real CLI entry with the
     default settings, a private ``redis-server`` of the run's own (free loopback port), the
     metrics endpoint on (``PIPELINE_RUNTIME__METRICS_PORT``).

   Both run on the lane with retry tiers ``1s, 5s`` (``*_tiers``) and on the same lane without
   ``retry:`` (``*_plain``), in rotated order every repeat, no failures. The timed span is the
   first byte to the N-th byte (process start, imports and the group join are outside it); CPU is
   the consumer's process tree (psutil) over the span. ``guarded_vs_bare`` = consume ÷ bare
   msgs/s with tiers and ``consume_plain_vs_bare`` the same without ``retry:`` (median of the
   per-repeat ratios). ``redis_calls_per_msg_clean``: the private Redis's ``INFO commandstats``
   (read over a raw socket) before the consumer starts and after it exited, the sum of every
   command's calls minus the INFO calls, ÷ messages, for consume with tiers (median over
   repeats). commandstats also counts the commands a Redis function runs inside, so this is
   executed commands, at least the commands sent; ``redis_commands_per_msg_clean`` breaks it down
   by command.

4. **Retries at 1 %** (``bench/guarded.py``), through ``pipeline consume`` too, as its own process
   with its own private Redis: a lane with retry tiers ``200ms, 1s``, 12 partitions, 1,000 keys,
   ``--retry-messages`` messages (default 20,000), and the handler's ``checked`` mode: it holds
   its key ``--hold-ms`` (default 1 ms), fails 1 % of the messages once (``crc32(value) % 100 == 0``
   on attempt 1) and writes its byte on a message's first success. Against the same lane with a
   handler that makes the same choice and never fails (``BENCH_INJECT=0``), interleaved, each run on
   a fresh lane (main, retry tiers and DLQ topics created and deleted). The timed span is the first
   byte to the last message's first success (so it includes the retry tiers' delay for the last
   failures). After it, the harness waits until the group's commits reach the end of every topic of
   the lane, then reads the retry tiers' end offsets. ``retry_1pct_cost`` = 1 - (msgs/s with
   failures / without), median per pair. Two parts of it, also median per pair:
   ``retry_delay_floor`` = 1 - clean span ÷ (clean span + the first tier's delay), what the delay
   alone costs (a message failing near the end of the backlog cannot succeed before its retry is
   due; ``retry_due_late_ms_p50``, ``_p90`` and ``_max`` say how late after its due time each
   retry copy's handler started, medians of the failing runs' own), and
   ``retry_1pct_cpu_cost`` = 1 - clean CPU per message ÷ failing CPU per message, what the failures
   cost the consumer's CPU; ``retry_cpu_ms_per_failure`` is the same CPU as milliseconds per
   injected failure (the failing run's process-tree CPU minus the clean run's, ÷ its failures;
   median per pair), split as ``retry_cpu_ms_per_failure_main`` (the consumer's main thread: its
   event loop, where every stage runs), ``_threads`` (its other threads: the Kafka client's and
   librdkafka's) and ``_children``. ``--retry-unordered`` runs the part on the same lane without
   ``ordered`` (``retry_lane``: ``unordered``): a failure is retried with no follower parked behind
   it, so the two runs tell what parking adds to a failure. Such a run reports its figures in the
   ``retry_*`` fields only (on an unordered lane a retried message succeeds after later ones of its
   key, as it should: ``retry_order_violations`` counts them), and leaves the target fields it would
   otherwise feed null.
   ``retry_amplification`` = entries written to the retry-tier topics ÷ failures the
   handler injected (median over the failing runs). The handler counts, in the process:
   ``order_violations``, successes that came after a later message of the same key (added to
   part 2's); ``key_overlaps``, a run of a key starting while another run of that key is still
   in the handler (a dict of keys running; exact, as there is one process); duplicates.

5. **Tracing** (``bench/tracing_parts.py``), in the configuration users run: ``pipeline consume``
   of the wire part's lane with retry tiers (its own process, a private Redis, metrics on, the
   no-op handler) over ``--messages`` messages (at most 20,000: every span of a 100 % run is held
   until exported) that carry a ``traceparent``, with tracing off and on (100 % sampling through
   the standard ``OTEL_*`` variables, exported to a sink process), interleaved, ``--repeats``
   times: ``tracing_overhead`` = on ÷ off msgs/s (median of the per-repeat ratios);
   ``tracing_off_overhead`` = 1 - the off hooks' time per message ÷ the off run's CPU per message;
   ``tracing_overhead_10pct`` = the same ratio as ``tracing_overhead`` with one message in ten
   sampled upstream (its ``traceparent`` flags; the default parent-based sampler follows);
   ``tracing_overhead_unexported`` = the same ratio with tracing on at 100 % and a batch queue of
   one record (``OTEL_BSP_MAX_QUEUE_SIZE=1``): every hook runs in the consumer and what it
   records is dropped at once, so nothing is shipped or exported, and the ratio is what the
   traced process's own hooks cost in place, the rest of ``tracing_overhead`` being the
   shipping and exporting;
   ``tracing_off_cpu_s_per_10k`` / ``tracing_on_cpu_s_per_10k`` = the consumer's process tree's
   CPU per 10k messages (medians; the exporting child process is in it), split in
   ``tracing_<off|on|unexported>_<part>_us_per_msg`` (medians, µs per message) between the
   consumer's ``main`` thread (its event loop: every stage and the tracing hooks), its other
   ``threads`` (the Kafka client's, the span shipper's, librdkafka's) and its ``children`` (the
   exporting process). The same runs of part
   1's member in this process (no Redis) are the extra fields ending in ``_bare`` (their CPU is
   this process's own, the exporting child not in it). ``tracing_export_us_per_delivery`` is
   the exporting process's encoding of one delivery's spans, timed in a loop here
   (``tracing_export_sdk_us_per_delivery``: the SDK's spans and encoder for the same record);
   ``tracing_exporter_cpu_us_per_delivery`` the real exporting process's CPU per delivery,
   50,000 records made by the hooks piped to it and sent to the sink (start-up not counted);
   ``tracing_hooks_on_us_per_msg`` the hooks' own time per delivery with tracing on.

The last line printed is one JSON object::

    {"bench": "runtime", "vs_raw": ..., "vs_faust": ..., "vs_faststream": ...,
     "key_parallel_speedup": ..., "retry_1pct_cost": ..., "order_violations": ...,
     "guarded_vs_bare": ..., "consume_plain_vs_bare": ..., "redis_calls_per_msg_clean": ...,
     "retry_amplification": ..., "key_overlaps": ..., "targets_met": {...}, ...}

with, besides, msgs/s and CPU-s per 10k of every runner (``wire_<runner>_msgs_s``,
``wire_<runner>_cpu_s_per_10k``, runners ``bare_tiers``, ``consume_tiers``, ``bare_plain``,
``consume_plain``). ``--parts`` runs some parts only (their fields stay null otherwise);
``--quick`` is a short run (5,000 messages, 2,000 per guarded and retry run, one repeat).
``--count-every N`` has the wire and tracing parts' handler write its bytes N at a time
(``count_every`` in the last line; default 1, a byte per message as the issue measures): each
write wakes the harness's reader on the other vCPU, which on a two-vCPU host slows what the
consumer does per message, so N > 1 tells that cost from the consumer's own. Every part
deletes its topics and groups, stops its private Redis and removes its directories.

Brokers come from the usual settings (``PIPELINE_KAFKA__BOOTSTRAP_SERVERS``,
``PIPELINE_REDIS__URL``); the script exits non-zero with a message if one cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import confluent_kafka
from common import BenchError, build_venv, cpu_s, package_versions, rotated
from confluent_kafka import Consumer as RawKafkaConsumer
from confluent_kafka import KafkaException
from confluent_kafka import TopicPartition as RawTopicPartition
from confluent_kafka.admin import AdminClient
from guarded import (
    RETRY_TIERS,
    WIRE_KEYS,
    WIRE_PARTITIONS,
    WIRE_RUNNERS,
    WIRE_TIERS,
    Retries,
    Wire,
    bench_retries,
    bench_wire,
    consume_run,
    wire_spec,
)
from lane_process import CPU_PARTS, Drain, ProcessBenchError
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from tracing_parts import (
    PIPED_DELIVERIES,
    delivery_records,
    export_encode_s,
    exporter_cpu_s,
    member_hooks_on_s,
    member_hooks_s,
    off_overhead,
    otlp_sink,
    traced_env,
    traced_here,
)

from pipeline.config import RuntimeSettings, Settings, load_settings
from pipeline.envelope import Position, Record, TopicPartition
from pipeline.errors import PipelineError, TransportError
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport
from pipeline.transport.protocol import Consumer, TopicConfig, Transport

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

PAD = b"x" * 1024
PARTITIONS = 12
KEYS = 1000
PRODUCE_WINDOW = 5000
POLL_MAX = 500
RUN_TIMEOUT_S = 180.0
COMMIT_WAIT_S = 5.0
PROBE_TIMEOUT_S = 5.0
WARMUP_MESSAGES = 5000

KP_MESSAGES = 10_000
KP_KEYS = 100
KP_MAX_SLEEP_S = 0.005
KP_CONCURRENCY = 100
# Diagnostic only: the high-water mark above the whole backlog, so flow control never pauses.
KP_NO_PAUSE = RuntimeSettings(max_concurrency=KP_CONCURRENCY, partition_high_water=KP_MESSAGES * 2)

PEERS_DIR = Path(__file__).resolve().parent / "peers"
PEER_VENV = PEERS_DIR / ".venv"
PEER_PYTHON = PEER_VENV / "bin" / "python"
PEER_STAMP = PEER_VENV / ".requirements.sha256"
PEER_SCRIPTS = {"faust": "faust_peer.py", "faststream": "faststream_peer.py"}
PEER_PACKAGES = {
    "faust": ["faust-streaming", "aiokafka"],
    "faststream": ["faststream", "aiokafka"],
}
RUNNERS = ("ours", "raw", "faust", "faststream")
TARGETS = {
    "vs_raw": (">=", 0.3),
    "vs_faust": (">=", 5.0),
    "vs_faststream": (">=", 2.0),
    "key_parallel_speedup": (">=", 10.0),
    "retry_1pct_cost": ("<=", 0.10),
    "order_violations": ("<=", 0),
    "guarded_vs_bare": (">=", 0.7),
    "consume_plain_vs_bare": (">=", 0.8),
    "redis_calls_per_msg_clean": ("<=", 0.05),
    "retry_amplification": ("<=", 1.1),
    "key_overlaps": ("<=", 0),
    "tracing_overhead": (">=", 0.85),
    "tracing_off_overhead": (">=", 0.98),
}
# field: (pipeline consume runner, bare runner on the same lane)
WIRE_RATIOS = {
    "guarded_vs_bare": ("consume_tiers", "bare_tiers"),
    "consume_plain_vs_bare": ("consume_plain", "bare_plain"),
}


class PeerError(Exception):
    """A peer could not be installed or run; it is reported as null with this reason."""


def _name(kind: str) -> str:
    return f"bench_{kind}_{uuid.uuid4().hex[:12]}"


def _value(seq: int) -> bytes:
    """1 KiB whose first 8 bytes are the produce sequence number (for order checks)."""
    return b"%08d" % seq + PAD[8:]


def _seq(value: bytes) -> int:
    return int(value[:8])


@dataclass(slots=True)
class Span:
    """One timed run: first message received to last message handled."""

    messages: int
    seconds: float
    cpu_s: float
    commit_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def msgs_s(self) -> float:
        """Throughput over the span."""
        return self.messages / self.seconds

    @property
    def cpu_per_10k(self) -> float:
        """Process CPU-seconds per 10,000 messages."""
        return self.cpu_s * 10_000 / self.messages


class Stopwatch:
    """Counts handled messages; the span runs from the first to the ``expected``-th."""

    def __init__(self, expected: int) -> None:
        """Expect ``expected`` messages."""
        self.expected = expected
        self.count = 0
        self.t0 = self.t1 = self.cpu0 = self.cpu1 = 0.0
        self.done = asyncio.Event()

    def tick(self) -> None:
        """One more message handled."""
        if self.count == 0:
            self.t0, self.cpu0 = time.perf_counter(), cpu_s()
        self.count += 1
        if self.count == self.expected:
            self.t1, self.cpu1 = time.perf_counter(), cpu_s()
            self.done.set()

    def span(self) -> Span:
        """The measured span."""
        return Span(self.count, self.t1 - self.t0, self.cpu1 - self.cpu0)


# -- the commit watch: when did our member's commits cover every message? ----------------------


class _WatchedConsumer:
    """Delegates to the real consumer; notes the time its commits first cover ``ends``."""

    def __init__(self, inner: Consumer, watch: CommitWatch) -> None:
        self._inner = inner
        self._watch = watch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def commit(self, positions: Sequence[Position]) -> None:
        await self._inner.commit(positions)
        self._watch.committed(positions)


class CommitWatch:
    """A transport wrapper whose consumers report their commits (nothing else changes)."""

    def __init__(self, transport: Transport, ends: dict[TopicPartition, int]) -> None:
        """Watch for commits reaching ``ends`` (the partitions' end offsets)."""
        self._transport = transport
        self.name = transport.name
        self._ends = ends
        self._positions: dict[TopicPartition, int] = {}
        self.covered_at: float | None = None
        self.covered = asyncio.Event()

    def producer(self) -> Any:
        """The real producer."""
        return self._transport.producer()

    def admin(self) -> Any:
        """The real admin."""
        return self._transport.admin()

    def consumer(self, group: str, topics: Sequence[str], **kwargs: Any) -> Consumer:
        """The real consumer, watched."""
        return _WatchedConsumer(self._transport.consumer(group, topics, **kwargs), self)  # type: ignore[return-value]

    def committed(self, positions: Sequence[Position]) -> None:
        """Note committed positions; set ``covered`` once every end is reached."""
        for p in positions:
            self._positions[p.tp] = p.offset
        if self.covered_at is None and all(
            self._positions.get(tp, 0) >= end for tp, end in self._ends.items()
        ):
            self.covered_at = time.perf_counter()
            self.covered.set()

    async def close(self) -> None:
        """Nothing of its own to release."""


# -- the harness ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Topic:
    """A topic produced for the benchmark and its end offsets."""

    name: str
    messages: int
    ends: dict[TopicPartition, int]


class Harness:
    """Owns the transport, the admin clients and Redis for all the measurements."""

    def __init__(self, settings: Settings) -> None:
        """Use the brokers of ``settings``."""
        self.settings = settings
        self.bootstrap = settings.kafka.bootstrap_servers
        self.transport = create_transport(settings, "kafka")
        self.admin = self.transport.admin()
        self.raw_admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        self.redis = Redis.from_url(
            settings.redis.url,
            socket_connect_timeout=PROBE_TIMEOUT_S,
            socket_timeout=settings.redis.socket_timeout_s,  # as `pipeline consume` has it
        )
        self.cleanup_warnings: list[str] = []

    async def probe(self) -> None:
        """Raise BenchError if Kafka or Redis cannot be reached."""
        try:
            await asyncio.to_thread(self.raw_admin.list_topics, None, PROBE_TIMEOUT_S)
        except KafkaException as exc:
            raise BenchError(
                f"Kafka broker unreachable at {self.bootstrap} "
                f"(PIPELINE_KAFKA__BOOTSTRAP_SERVERS): {exc.args[0]}"
            ) from exc
        try:
            await self.redis.ping()
        except (redis_errors.RedisError, OSError) as exc:
            raise BenchError(
                f"Redis unreachable at {self.settings.redis.url} (PIPELINE_REDIS__URL): {exc}"
            ) from exc

    async def close(self) -> None:
        """Release every client."""
        await self.admin.close()
        await self.transport.close()
        await self.redis.aclose()

    # -- topics ---------------------------------------------------------------------------------

    def _wait_leaders(self, topics: Sequence[str], partitions: int) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            meta = self.raw_admin.list_topics(None, PROBE_TIMEOUT_S).topics
            if all(
                (t := meta.get(name)) is not None
                and t.error is None
                and len(t.partitions) == partitions
                and all(p.leader >= 0 for p in t.partitions.values())
                for name in topics
            ):
                return
            time.sleep(0.05)
        raise BenchError(f"topics {list(topics)} have no leaders")

    async def create_topic(self, name: str, partitions: int) -> None:
        """A plain topic (no lane) with leaders ready."""
        await self.admin.create_topic(TopicConfig(name, partitions))
        await asyncio.to_thread(self._wait_leaders, [name], partitions)

    async def declare(self, spec: TopicSpec) -> None:
        """A lane's topics (main, retry tiers, dead letter), as ``pipeline topics apply`` would."""
        for attempt in range(20):
            try:
                await apply(self.admin, [spec], 100_000, dry_run=False)
                break
            except TransportError:
                # KafkaAdmin.list_topics lists offsets of every topic and fails while any topic
                # of the cluster is being deleted; try again once the deletion is through.
                if attempt == 19:
                    raise
                await asyncio.sleep(0.5)
        await asyncio.to_thread(self._wait_leaders, spec.topic_names(), spec.partitions)

    async def produce(
        self,
        name: str,
        n: int,
        keys: int,
        headers: Callable[[int], dict[str, bytes]] | None = None,
    ) -> Topic:
        """``n`` messages with sequence-numbered 1 KiB values and keys ``k<seq % keys>``.

        ``headers``, if given, makes each message's headers from its sequence number.
        """
        producer = self.transport.producer()
        ends: dict[TopicPartition, int] = {}
        try:
            for start in range(0, n, PRODUCE_WINDOW):
                window = range(start, min(n, start + PRODUCE_WINDOW))
                receipts = await producer.send_many(
                    name,
                    [
                        Record(_value(i), b"k%d" % (i % keys), headers(i) if headers else None)
                        for i in window
                    ],
                )
                for r in receipts:
                    tp = TopicPartition(r.topic, r.partition)
                    ends[tp] = max(ends.get(tp, 0), r.offset + 1)
        finally:
            await producer.close()
        return Topic(name, n, ends)

    async def drop_topics(self, names: Sequence[str]) -> None:
        """Delete topics and wait until they are gone; a failure is a warning, not an error."""
        for name in names:
            try:
                await self.admin.delete_topic(name)
            except TransportError as exc:
                self.cleanup_warnings.append(f"topic {name}: {exc}")
        await asyncio.to_thread(self._wait_gone, names)

    def _wait_gone(self, names: Sequence[str]) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not set(names) & set(self.raw_admin.list_topics(None, PROBE_TIMEOUT_S).topics):
                return
            time.sleep(0.1)
        self.cleanup_warnings.append(f"topics {list(names)} still listed 30 s after deletion")

    def _topics_named(self, prefix: str) -> list[str]:
        return [
            t
            for t in self.raw_admin.list_topics(None, PROBE_TIMEOUT_S).topics
            if t.startswith(prefix)
        ]

    async def drop_group(self, group: str) -> None:
        """Delete a consumer group (retrying while its last member is still leaving)."""
        for _ in range(20):
            try:
                await self.admin.delete_group(group, [])
            except TransportError as exc:
                last = str(exc)
                await asyncio.sleep(0.5)
            else:
                return
        self.cleanup_warnings.append(f"group {group}: {last}")

    async def fully_committed(self, group: str, topic: Topic) -> bool:
        """True if the group's committed positions reached every partition's end."""
        lags = await self.admin.group_lag(group, topic.name)
        return all(lag.committed is not None and lag.committed >= lag.end for lag in lags)

    # -- runners: ours --------------------------------------------------------------------------

    async def run_member(
        self,
        spec: TopicSpec,
        group: str,
        watch: Stopwatch,
        handler: Callable[[bytes, Context], Awaitable[None]],
        settings: RuntimeSettings,
        *,
        ends: dict[TopicPartition, int] | None = None,
        redis_prefix: str | None = None,
    ) -> tuple[Span, Member]:
        """Run a member over ``spec`` until ``watch`` is done; returns the span and the member."""
        app = App([spec])
        app.handler(spec.lane)(handler)
        commits = CommitWatch(self.transport, ends or {})
        member = Member(
            app,
            commits,  # type: ignore[arg-type]
            group,
            settings,
            redis=self.redis if redis_prefix else None,
            redis_prefix=redis_prefix or "pl",
        )
        stop = asyncio.Event()
        task = asyncio.create_task(member.run(stop))
        try:
            waiter = asyncio.create_task(watch.done.wait())
            finished, _ = await asyncio.wait(
                {task, waiter}, timeout=RUN_TIMEOUT_S, return_when="FIRST_COMPLETED"
            )
            waiter.cancel()
            if task in finished:
                task.result()  # raises what the member raised
                raise BenchError("the member stopped by itself")
            if not watch.done.is_set():
                raise BenchError(f"ours: {watch.count} of {watch.expected} handled in time")
            span = watch.span()
            if ends:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(commits.covered.wait(), COMMIT_WAIT_S)
                if commits.covered_at is not None:
                    span.commit_s = max(0.0, commits.covered_at - watch.t1)
            return span, member
        finally:
            stop.set()
            await asyncio.wait_for(task, 60)

    async def ours(self, topic: Topic, n: int) -> Span:
        """Our member, no-op handler, default runtime settings, no Redis."""
        spec = TopicSpec.model_validate(
            {"name": topic.name, "partitions": PARTITIONS, "lane": "bench"}
        )
        group = _name("ours")
        watch = Stopwatch(n)

        async def handle(_event: bytes, _ctx: Context) -> None:
            watch.tick()

        try:
            span, _ = await self.run_member(
                spec,
                group,
                watch,
                handle,
                RuntimeSettings(),
                ends=topic.ends if n == topic.messages else None,
            )
            if n == topic.messages:
                span.extra["fully_committed"] = await self.fully_committed(group, topic)
            return span
        finally:
            await self.drop_group(group)

    # -- runners: raw ---------------------------------------------------------------------------

    async def raw(self, topic: Topic, n: int) -> Span:
        """confluent-kafka's consume loop with a synchronous commit per batch (on a thread)."""
        group = _name("raw")
        try:
            span = await asyncio.to_thread(self._raw_sync, topic.name, group, n)
            if n == topic.messages:
                span.extra["fully_committed"] = await self.fully_committed(group, topic)
            return span
        finally:
            await self.drop_group(group)

    def _raw_sync(self, topic: str, group: str, n: int) -> Span:
        consumer = RawKafkaConsumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
            }
        )

        def noop(_value: bytes | None) -> None:
            """The handler: does nothing."""

        try:
            consumer.subscribe([topic])
            received = 0
            t0 = cpu0 = t_handled = 0.0
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while received < n:
                batch = consumer.consume(POLL_MAX, 1.0)
                if not batch:
                    if time.monotonic() > deadline:
                        raise BenchError(f"raw: received {received} of {n}")
                    continue
                if received == 0:
                    t0, cpu0 = time.perf_counter(), cpu_s()
                last: dict[int, int] = {}
                for msg in batch:
                    if msg.error() is not None:
                        raise BenchError(f"raw consume: {msg.error()}")
                    noop(msg.value())
                    last[msg.partition()] = msg.offset()  # type: ignore[index]
                    received += 1
                    if received == n:
                        break
                t_handled = time.perf_counter()
                consumer.commit(
                    offsets=[RawTopicPartition(topic, p, o + 1) for p, o in last.items()],
                    asynchronous=False,
                )
            t1, cpu1 = time.perf_counter(), cpu_s()
            span = Span(received, t1 - t0, cpu1 - cpu0, commit_s=0.0)
            span.extra["handled_s"] = t_handled - t0
            return span
        finally:
            consumer.close()

    # -- runners: peers -------------------------------------------------------------------------

    async def peer(self, name: str, topic: Topic, n: int) -> Span:
        """Run a peer script in the peers' venv; raises PeerError if it fails."""
        group = _name(name)
        workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
        cmd = [
            str(PEER_PYTHON),
            str(PEERS_DIR / PEER_SCRIPTS[name]),
            "--bootstrap",
            self.bootstrap,
            "--topic",
            topic.name,
            "--group",
            group,
            "--messages",
            str(n),
            "--timeout",
            str(RUN_TIMEOUT_S),
        ]
        started = time.perf_counter()
        try:
            return await self._peer_run(name, cmd, workdir, started, topic, group, n)
        except subprocess.TimeoutExpired as exc:
            raise PeerError(f"{name} did not finish within {exc.timeout:.0f} s") from exc
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            await self.drop_group(group)
            own = await asyncio.to_thread(self._topics_named, group)
            await self.drop_topics(own)  # faust's <app id>-__assignor-__leader

    async def _peer_run(
        self,
        name: str,
        cmd: list[str],
        workdir: Path,
        started: float,
        topic: Topic,
        group: str,
        n: int,
    ) -> Span:
        proc = await asyncio.to_thread(
            subprocess.run,
            cmd,
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S + 60,
            check=False,
        )
        process_s = time.perf_counter() - started
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if not lines:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise PeerError(f"{name} exited {proc.returncode} without a result: {' | '.join(tail)}")
        try:
            result = json.loads(lines[-1].removeprefix("RESULT "))
            handled, seconds, cpu = result["messages"], result["seconds"], result["cpu_s"]
        except (ValueError, KeyError, TypeError) as exc:
            raise PeerError(f"{name} printed an unreadable result: {lines[-1][:200]}") from exc
        if handled != n:
            raise PeerError(f"{name} handled {handled} of {n}")
        span = Span(n, seconds, cpu, commit_s=result.get("commit_s"))
        span.extra = {k: v for k, v in result.items() if k not in {"seconds", "cpu_s", "messages"}}
        span.extra["process_s"] = process_s
        if n == topic.messages:
            span.extra["fully_committed"] = await self.fully_committed(group, topic)
        return span


# -- the peers' virtualenv -----------------------------------------------------------------------


def ensure_peer_env() -> dict[str, str]:
    """Create or update bench/peers/.venv from requirements.txt; returns package versions.

    Raises PeerError with the reason if it cannot be built.
    """
    packages = sorted({p for ps in PEER_PACKAGES.values() for p in ps})
    try:
        build_venv(PEER_VENV, PEERS_DIR / "requirements.txt", "faust-streaming, faststream")
        return package_versions(PEER_PYTHON, packages)
    except BenchError as exc:
        raise PeerError(str(exc)) from exc


# -- the three measurements ----------------------------------------------------------------------


@dataclass(slots=True)
class Throughput:
    """Interleaved repeats of the four runners; a failed peer keeps its reason."""

    runs: dict[str, list[Span]] = field(default_factory=lambda: {r: [] for r in RUNNERS})
    errors: dict[str, str] = field(default_factory=dict)

    def ratios(self, peer: str) -> list[float] | None:
        """ours/peer msgs/s per repeat (None if the peer failed)."""
        if peer in self.errors or not self.runs[peer]:
            return None
        return [
            o.msgs_s / p.msgs_s for o, p in zip(self.runs["ours"], self.runs[peer], strict=True)
        ]


async def bench_throughput(
    h: Harness, n: int, repeats: int, peers: Sequence[str], errors: dict[str, str]
) -> Throughput:
    """Produce once, then ``repeats`` rounds of every runner in rotated order."""
    result = Throughput(errors=dict(errors))
    topic_name = _name("tput")
    await h.create_topic(topic_name, PARTITIONS)
    try:
        topic = await h.produce(topic_name, n, KEYS)
        runners: dict[str, Callable[[int], Awaitable[Span]]] = {
            "ours": lambda m: h.ours(topic, m),
            "raw": lambda m: h.raw(topic, m),
        }
        for peer in peers:
            if peer not in result.errors:
                runners[peer] = lambda m, p=peer: h.peer(p, topic, m)
        # Warm-up (discarded): page cache, imports, the event loop's first allocations.
        await h.ours(topic, min(n, WARMUP_MESSAGES))
        await h.raw(topic, min(n, WARMUP_MESSAGES))
        order = [r for r in RUNNERS if r in runners]
        for i in range(repeats):
            line = []
            for name in rotated(order, i):
                if name in result.errors:
                    continue
                try:
                    span = await runners[name](n)
                except PeerError as exc:
                    result.errors[name] = str(exc)
                    result.runs[name] = []
                    print(f"  {name}: failed, reported as null: {exc}", file=sys.stderr)
                    continue
                result.runs[name].append(span)
                line.append(f"{name} {span.msgs_s:,.0f}/s")
            print(
                f"  throughput {i + 1}/{repeats}: " + ", ".join(line), file=sys.stderr, flush=True
            )
    finally:
        await h.drop_topics([topic_name])
    return result


@dataclass(slots=True)
class KeyParallel:
    """Interleaved (concurrency 100, concurrency 1) runs on one partition."""

    parallel: list[Span] = field(default_factory=list)
    serial: list[Span] = field(default_factory=list)
    no_pause: list[Span] = field(default_factory=list)
    order_violations: int = 0

    @property
    def speedups(self) -> list[float]:
        """parallel/serial msgs/s per repeat."""
        return [p.msgs_s / s.msgs_s for p, s in zip(self.parallel, self.serial, strict=True)]

    @property
    def speedups_no_pause(self) -> list[float]:
        """Diagnostic: parallel with the high-water mark above the backlog / serial, per repeat."""
        return [p.msgs_s / s.msgs_s for p, s in zip(self.no_pause, self.serial, strict=True)]


def _order_violations(seen: dict[bytes, list[int]]) -> int:
    """Successes that came after a later message of the same key."""
    count = 0
    for seqs in seen.values():
        top = -1
        for s in seqs:
            if s < top:
                count += 1
            top = max(top, s)
    return count


async def _kp_run(
    h: Harness, spec: TopicSpec, settings: RuntimeSettings, seed: int
) -> tuple[Span, int]:
    watch = Stopwatch(KP_MESSAGES)
    seen: dict[bytes, list[int]] = defaultdict(list)
    rng = random.Random(seed)

    async def handle(event: bytes, ctx: Context) -> None:
        await asyncio.sleep(rng.uniform(0, KP_MAX_SLEEP_S))
        seen[ctx.message.key or b""].append(_seq(event))
        watch.tick()

    group = _name(f"kp{settings.max_concurrency}")
    try:
        span, _ = await h.run_member(spec, group, watch, handle, settings)
    finally:
        await h.drop_group(group)
    return span, _order_violations(seen)


async def bench_key_parallel(h: Harness, repeats: int) -> KeyParallel:
    """10k messages, 1 partition, 100 keys, 0-5 ms async sleep: concurrency 100 vs 1."""
    result = KeyParallel()
    name = _name("kp")
    spec = TopicSpec.model_validate({"name": name, "partitions": 1, "lane": "bench_kp"})
    await h.declare(spec)
    try:
        await h.produce(name, KP_MESSAGES, KP_KEYS)
        for i in range(repeats):
            runs = [
                (RuntimeSettings(max_concurrency=KP_CONCURRENCY), result.parallel),
                (RuntimeSettings(max_concurrency=1), result.serial),
                (KP_NO_PAUSE, result.no_pause),
            ]
            for settings, spans in runs if i % 2 == 0 else runs[::-1]:
                span, violations = await _kp_run(h, spec, settings, seed=i)
                result.order_violations += violations
                spans.append(span)
            print(
                f"  key parallel {i + 1}/{repeats}: concurrency {KP_CONCURRENCY} "
                f"{result.parallel[-1].msgs_s:,.0f}/s, concurrency 1 "
                f"{result.serial[-1].msgs_s:,.0f}/s (diagnostic, never paused: "
                f"{result.no_pause[-1].msgs_s:,.0f}/s)",
                file=sys.stderr,
                flush=True,
            )
    finally:
        await h.drop_topics(spec.topic_names())
    return result


# -- report --------------------------------------------------------------------------------------


def _med(values: Sequence[float]) -> float:
    return statistics.median(values)


def _fmt_med(values: Sequence[float], spec: str) -> str:
    """The median of ``values`` formatted with ``spec``, or ``-`` when there are none."""
    return format(_med(values), spec) if values else "-"


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _met(name: str, value: float | None) -> bool | None:
    if value is None:
        return None
    op, target = TARGETS[name]
    return value >= target if op == ">=" else value <= target


@dataclass(slots=True)
class Results:
    """What the parts that ran measured (a part left out with ``--parts`` stays None)."""

    tp: Throughput | None = None
    kp: KeyParallel | None = None
    wire: Wire | None = None
    rt: Retries | None = None
    tr: TracingCost | None = None
    versions: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _tables_throughput(tp: Throughput, n: int) -> None:
    print(f"\nthroughput: {n:,} x 1 KiB, {PARTITIONS} partitions, {KEYS} keys, no-op handler")
    print(f"{'runner':>12}{'msgs/s':>10}{'cpu/10k':>10}{'commit s':>10}  runs (msgs/s)")
    for name in RUNNERS:
        runs = tp.runs[name]
        if not runs:
            print(f"{name:>12}{'null':>10}  {tp.errors.get(name, 'not run')}")
            continue
        commits = [r.commit_s for r in runs if r.commit_s is not None]
        print(
            f"{name:>12}{_med([r.msgs_s for r in runs]):>10,.0f}"
            f"{_med([r.cpu_per_10k for r in runs]):>10.2f}"
            f"{(_med(commits) if commits else float('nan')):>10.3f}  "
            + ", ".join(f"{r.msgs_s:,.0f}" for r in runs)
        )
    for peer in RUNNERS[1:]:
        ratios = tp.ratios(peer)
        text = (
            "null"
            if ratios is None
            else f"{_med(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)})"
        )
        print(f"  ours/{peer}: {text}")


def _tables_key_parallel(kp: KeyParallel) -> None:
    print(f"\nkey parallel: {KP_MESSAGES:,} msgs, 1 partition, {KP_KEYS} keys, sleep 0-5 ms")
    print(
        f"  concurrency 100: {_med([s.msgs_s for s in kp.parallel]):,.0f}/s; "
        f"concurrency 1: {_med([s.msgs_s for s in kp.serial]):,.0f}/s; "
        f"speedup {_med(kp.speedups):.1f} ({', '.join(f'{x:.1f}' for x in kp.speedups)})"
    )
    print(
        f"  diagnostic, concurrency {KP_CONCURRENCY} never paused (partition_high_water "
        f"{KP_NO_PAUSE.partition_high_water:,}): {_med([s.msgs_s for s in kp.no_pause]):,.0f}/s, "
        f"speedup {_med(kp.speedups_no_pause):.1f}"
    )


def _tables_wire(wire: Wire, n: int) -> None:
    print(
        f"\nguarded vs bare: {n:,} x 1 KiB, {WIRE_PARTITIONS} partitions, {WIRE_KEYS} keys, "
        "ordered, one byte per message, each consumer its own process"
    )
    print(f"{'runner':>14}{'msgs/s':>10}{'cpu/10k':>10}{'redis/msg':>11}  runs (msgs/s)")
    for name in WIRE_RUNNERS:
        runs = wire.runs[name]
        calls = [c for r in runs if (c := r.redis_calls_per_msg) is not None]
        print(
            f"{name:>14}{_med([r.msgs_s for r in runs]):>10,.0f}"
            f"{_med([r.cpu_per_10k for r in runs]):>10.2f}"
            f"{(f'{_med(calls):.3f}' if calls else '-'):>11}  "
            + ", ".join(f"{r.msgs_s:,.0f}" for r in runs)
        )
    for field_name, (consume, bare) in WIRE_RATIOS.items():
        ratios = wire.ratios(consume, bare)
        print(f"  {field_name}: {_med(ratios):.3f} ({', '.join(f'{x:.3f}' for x in ratios)})")


def _tables_retries(rt: Retries, n: int, *, ordered: bool) -> None:
    parking = "ordered lane, parking on" if ordered else "unordered lane, no parking"
    print(
        f"\nretries: {n:,} msgs, `pipeline consume`, tiers {RETRY_TIERS}, {parking}, "
        "1% failing once"
    )
    amplifications = [a for a in rt.amplifications if a is not None]
    print(
        f"  clean: {_med([s.msgs_s for s in rt.clean]):,.0f}/s; "
        f"1% failing: {_med([s.msgs_s for s in rt.failing]):,.0f}/s; "
        f"cost {_med(rt.costs):.3f} ({', '.join(f'{x:.3f}' for x in rt.costs)}; of it, "
        f"the first tier's delay alone {_med(rt.delay_floors):.3f}; CPU "
        f"{_med(rt.cpu_costs):.3f}, {_fmt_med(rt.cpu_ms_per_failure, '.2f')} ms per failure); "
        f"amplification {_fmt_med(amplifications, '.2f')}; "
        f"order violations {rt.total('order_violations')}; "
        f"key overlaps {rt.total('key_overlaps')}"
        + ("" if ordered else " (expected: an unordered lane keeps no per-key order)")
    )


def print_tables(res: Results, args: argparse.Namespace) -> None:
    """Human-readable tables (medians over repeats) of the parts that ran."""
    if res.tp is not None:
        _tables_throughput(res.tp, args.messages)
    if res.kp is not None:
        _tables_key_parallel(res.kp)
    if res.wire is not None:
        _tables_wire(res.wire, args.wire_messages)
    if res.rt is not None:
        _tables_retries(res.rt, args.retry_messages, ordered=not args.retry_unordered)


def _summary_throughput(tp: Throughput) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for peer in RUNNERS[1:]:
        if peer in tp.errors:
            out[f"{peer}_error"] = tp.errors[peer]
        ratios = tp.ratios(peer)
        out[f"vs_{peer}_ratios"] = [_r(x) for x in ratios] if ratios else None
    for name in RUNNERS:
        runs = tp.runs[name]
        out[f"{name}_msgs_s"] = round(_med([r.msgs_s for r in runs])) if runs else None
        out[f"{name}_cpu_s_per_10k"] = _r(_med([r.cpu_per_10k for r in runs])) if runs else None
        commits = [r.commit_s for r in runs if r.commit_s is not None]
        out[f"{name}_commit_s"] = _r(_med(commits)) if commits else None
        out[f"{name}_fully_committed"] = (
            all(r.extra.get("fully_committed", False) for r in runs) if runs else None
        )
    return out


def _summary_key_parallel(kp: KeyParallel) -> dict[str, Any]:
    return {
        "kp_parallel_msgs_s": round(_med([s.msgs_s for s in kp.parallel])),
        "kp_serial_msgs_s": round(_med([s.msgs_s for s in kp.serial])),
        "kp_speedups": [_r(x, 2) for x in kp.speedups],
        "kp_order_violations": kp.order_violations,
        "kp_no_pause_msgs_s": round(_med([s.msgs_s for s in kp.no_pause])),
        "key_parallel_speedup_no_pause": _r(_med(kp.speedups_no_pause), 2),
    }


def _per_msg(runs: Sequence[Drain]) -> dict[str, float]:
    """Redis commands by name per message, over every run."""
    total: dict[str, int] = defaultdict(int)
    for run in runs:
        for name, calls in (run.redis_calls or {}).items():
            total[name] += calls
    messages = sum(r.messages for r in runs)
    return {name: round(calls / messages, 4) for name, calls in sorted(total.items())}


def _calls(runs: Sequence[Drain]) -> float | None:
    values = [c for r in runs if (c := r.redis_calls_per_msg) is not None]
    return _r(_med(values), 4) if values else None


def _summary_wire(wire: Wire) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field_name, (consume, bare) in WIRE_RATIOS.items():
        out[f"{field_name}_ratios"] = [_r(x) for x in wire.ratios(consume, bare)]
    for name in WIRE_RUNNERS:
        runs = wire.runs[name]
        out[f"wire_{name}_msgs_s"] = round(_med([r.msgs_s for r in runs]))
        out[f"wire_{name}_cpu_s_per_10k"] = _r(_med([r.cpu_per_10k for r in runs]))
    out["redis_calls_per_msg_plain"] = _calls(wire.runs["consume_plain"])
    # What the member sent as calls of its own (each Redis Function call is one round trip;
    # the commands a function runs inside it are Redis's work, counted above).
    clean = _per_msg(wire.runs["consume_tiers"])
    out["redis_fcalls_per_msg_clean"] = clean.get("fcall")
    out["redis_commands_per_msg_clean"] = clean
    out["redis_commands_per_msg_plain"] = _per_msg(wire.runs["consume_plain"])
    return out


def _late_fields(failing: list[Drain]) -> dict[str, float | None]:
    """How late the retry copies' handlers started after their due time: median per run."""
    out: dict[str, float | None] = {}
    for part in ("p50", "p90", "max"):
        name = f"retry_late_ms_{part}"
        values = [s.stats[name] for s in failing if name in s.stats]
        out[f"retry_due_late_ms_{part}"] = _r(_med(values)) if values else None
    return out


def _summary_retries(rt: Retries) -> dict[str, Any]:
    return {
        "retry_clean_msgs_s": round(_med([s.msgs_s for s in rt.clean])),
        "retry_failing_msgs_s": round(_med([s.msgs_s for s in rt.failing])),
        "retry_costs": [_r(x) for x in rt.costs],
        "retry_1pct_cpu_cost": _r(_med(rt.cpu_costs)),
        "retry_cpu_ms_per_failure": (
            _r(_med(rt.cpu_ms_per_failure)) if rt.cpu_ms_per_failure else None
        ),
        "retry_delay_floor": _r(_med(rt.delay_floors)),
        **_late_fields(rt.failing),
        "retry_amplifications": [_r(x) for x in rt.amplifications],
        "retry_order_violations": rt.total("order_violations"),
        "retry_duplicates": rt.total("duplicates"),
        "retry_dead_lettered": rt.total("dead_lettered"),
        "retry_injected_failures": rt.total("injected_failures"),
        "retry_entries": rt.total("retry_entries"),
        "retry_settled": all(s.stats.get("settled") for s in [*rt.clean, *rt.failing]),
        "retry_failing_runs": [s.stats for s in rt.failing],
        "retry_cpu_s_per_10k_clean": _r(_med([s.cpu_per_10k for s in rt.clean])),
        "retry_cpu_s_per_10k_failing": _r(_med([s.cpu_per_10k for s in rt.failing])),
        **{
            f"retry_cpu_ms_per_failure_{part}": _r(_med(ms))
            for part in CPU_PARTS
            if (ms := rt.cpu_ms_per_failure_in(part))
        },
        "redis_calls_per_msg_retry_clean": _calls(rt.clean),
        "redis_calls_per_msg_retry_failing": _calls(rt.failing),
        "redis_commands_per_msg_retry_failing": _per_msg(rt.failing),
    }


def summary(res: Results, args: argparse.Namespace) -> dict[str, Any]:
    """The machine-readable result (the last line of output); a part not run gives nulls."""
    tp, kp, wire = res.tp, res.kp, res.wire
    # The targets are the ordered lane's: an unordered run's figures go in retry_* only.
    rt = None if args.retry_unordered else res.rt
    out: dict[str, Any] = {"bench": "runtime"}
    for peer in RUNNERS[1:]:
        ratios = tp.ratios(peer) if tp else None
        out[f"vs_{peer}"] = _r(_med(ratios)) if ratios else None
    out["key_parallel_speedup"] = _r(_med(kp.speedups), 2) if kp else None
    out["retry_1pct_cost"] = _r(_med(rt.costs)) if rt else None
    violations = [kp.order_violations] if kp else []
    violations += [rt.total("order_violations")] if rt else []
    out["order_violations"] = sum(violations) if violations else None
    for field_name, (consume, bare) in WIRE_RATIOS.items():
        out[field_name] = _r(_med(wire.ratios(consume, bare))) if wire else None
    out["redis_calls_per_msg_clean"] = _calls(wire.runs["consume_tiers"]) if wire else None
    amplifications = [a for a in rt.amplifications if a is not None] if rt else []
    out["retry_amplification"] = _r(_med(amplifications)) if amplifications else None
    out["key_overlaps"] = rt.total("key_overlaps") if rt else None
    out |= _summary_tracing(res.tr)
    out["targets_met"] = {name: _met(name, out[name]) for name in TARGETS}
    out |= _summary_throughput(tp) if tp else {}
    out |= _summary_key_parallel(kp) if kp else {}
    out |= _summary_wire(wire) if wire else {}
    out |= _summary_retries(res.rt) if res.rt else {}
    out |= {
        "parts": args.parts,
        "messages": args.messages,
        "wire_messages": args.wire_messages,
        "retry_messages": args.retry_messages,
        "retry_hold_ms": args.hold_ms,
        "retry_lane": "unordered" if args.retry_unordered else "ordered",
        "count_every": args.count_every,
        "repeats": args.repeats,
        "partitions": PARTITIONS,
        "keys": KEYS,
        "wire_partitions": WIRE_PARTITIONS,
        "wire_tiers": WIRE_TIERS,
        "retry_tiers": RETRY_TIERS,
        "message_bytes": len(PAD),
        "faststream_backend": "aiokafka",
        "versions": {
            "python": platform.python_version(),
            "confluent_kafka": version("confluent-kafka"),
            "librdkafka": confluent_kafka.libversion()[0],
            "redis_py": version("redis"),
            **res.versions,
        },
        "git": _git_state(),
        "cpus": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d"),
    }
    return out


def _git_state() -> dict[str, Any]:
    """HEAD and whether pipeline/ has uncommitted changes (read-only git calls)."""

    def git(*args: str) -> str:
        proc = subprocess.run(
            ["git", *args], capture_output=True, text=True, check=False, cwd=PEERS_DIR.parent
        )
        return proc.stdout.strip() if proc.returncode == 0 else ""

    return {
        "head": git("rev-parse", "--short", "HEAD") or None,
        "pipeline_dirty": bool(git("status", "--porcelain", "--", "../pipeline")),
    }


async def run(args: argparse.Namespace) -> Results:
    """Probe, build the peers' venv if needed, then the chosen parts in order."""
    res = Results()
    peers = [p for p in ("faust", "faststream") if p not in args.skip]
    errors: dict[str, str] = dict.fromkeys(args.skip, "skipped (--skip)")
    if peers and "throughput" in args.parts:
        try:
            res.versions = await asyncio.to_thread(ensure_peer_env)
        except (PeerError, OSError, subprocess.SubprocessError) as exc:
            errors |= {p: str(exc) for p in peers}
    h = Harness(load_settings())
    try:
        await h.probe()
        if "throughput" in args.parts:
            res.tp = await bench_throughput(h, args.messages, args.repeats, peers, errors)
        if "key_parallel" in args.parts:
            res.kp = await bench_key_parallel(h, args.repeats)
        if "wire" in args.parts:
            res.wire = await bench_wire(h, args.wire_messages, args.repeats)
        if "retries" in args.parts:
            res.rt = await bench_retries(
                h,
                args.retry_messages,
                args.repeats,
                args.hold_ms,
                ordered=not args.retry_unordered,
            )
        if "tracing" in args.parts:
            res.tr = await bench_tracing(h, tracing_messages(args), args.repeats)
        res.warnings = h.cleanup_warnings
        return res
    finally:
        await h.close()


@dataclass(slots=True)
class TracingCost:
    """Interleaved runs with tracing off, on at 100 % and on for sampled parents (one in ten).

    ``off``, ``on`` and ``tenth`` are ``pipeline consume`` of the lane with retry tiers, as its
    own process (what users run); the ``bare_*`` lists are part 1's member in this process.
    """

    off: list[Drain] = field(default_factory=list)
    on: list[Drain] = field(default_factory=list)
    tenth: list[Drain] = field(default_factory=list)
    unexported: list[Drain] = field(default_factory=list)
    """On at 100 % with a batch queue of one: the hooks run, their records are dropped."""
    bare_off: list[Span] = field(default_factory=list)
    bare_on: list[Span] = field(default_factory=list)
    bare_tenth: list[Span] = field(default_factory=list)
    hooks_s: float = 0.0
    hooks_on_s: float = 0.0
    export_s: float = 0.0
    export_sdk_s: float = 0.0
    exporter_s: float | None = None
    """The exporting process's CPU seconds per piped delivery, its start-up not counted."""


async def bench_tracing(h: Harness, n: int, repeats: int) -> TracingCost:
    """Tracing off and on, over messages carrying a traceparent: ``pipeline consume``, then bare."""
    result = TracingCost(hooks_s=member_hooks_s(), hooks_on_s=member_hooks_on_s())
    result.export_s, result.export_sdk_s = export_encode_s()
    spec = wire_spec(_name("traced_lane"))
    lane_topics = TopicSpec.model_validate(spec).topic_names()
    name = _name("traced")
    await h.declare(TopicSpec.model_validate(spec))
    await h.create_topic(name, PARTITIONS)
    try:
        await h.produce(spec["name"], n, KEYS, _traceparent)
        topic = await h.produce(name, n, KEYS, _traceparent)
        modes = ["off", "all", "tenth", "unexported"]
        with otlp_sink() as endpoint:
            piped = delivery_records(PIPED_DELIVERIES)
            result.exporter_s = exporter_cpu_s(piped, endpoint) / len(piped)
            del piped
            envs = {
                "off": None,
                "all": traced_env(endpoint),
                "tenth": traced_env(endpoint, sampled_only=True),
                "unexported": traced_env(endpoint, unexported=True),
            }
            runs = {
                "off": result.off,
                "all": result.on,
                "tenth": result.tenth,
                "unexported": result.unexported,
            }
            for i in range(repeats):
                for mode in rotated(modes, i):
                    runs[mode].append(await consume_run(h, spec, n, envs[mode]))
                print(
                    f"  tracing, pipeline consume {i + 1}/{repeats}: off "
                    f"{result.off[-1].msgs_s:,.0f}/s, on {result.on[-1].msgs_s:,.0f}/s, "
                    f"10 % {result.tenth[-1].msgs_s:,.0f}/s, "
                    f"unexported {result.unexported[-1].msgs_s:,.0f}/s",
                    file=sys.stderr,
                    flush=True,
                )
            await h.ours(topic, min(n, WARMUP_MESSAGES))
            for i in range(repeats):
                for mode in rotated(modes[:3], i):  # unexported: a consume run only
                    if mode == "off":
                        result.bare_off.append(await h.ours(topic, n))
                        continue
                    with traced_here(endpoint, sampled_only=mode == "tenth"):
                        span = await h.ours(topic, n)
                    (result.bare_on if mode == "all" else result.bare_tenth).append(span)
                print(
                    f"  tracing, bare member {i + 1}/{repeats}: off "
                    f"{result.bare_off[-1].msgs_s:,.0f}/s, on {result.bare_on[-1].msgs_s:,.0f}/s, "
                    f"10 % {result.bare_tenth[-1].msgs_s:,.0f}/s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        await h.drop_topics([name, *lane_topics])
    return result


def _traceparent(seq: int) -> dict[str, bytes]:
    """A distinct trace per message, sampled (flags 01) for one message in ten."""
    flags = b"01" if seq % 10 == 0 else b"00"
    return {"traceparent": b"00-%032x-00f067aa0ba902b7-" % (seq + 1) + flags}


def _ratios(on: Sequence[Span | Drain], off: Sequence[Span | Drain]) -> list[float]:
    return [a.msgs_s / b.msgs_s for a, b in zip(on, off, strict=True)]


def _summary_tracing(tr: TracingCost | None) -> dict[str, Any]:
    if tr is None or not tr.off:
        return {"tracing_overhead": None, "tracing_off_overhead": None}
    cpu_per_msg = _med([s.cpu_s / s.messages for s in tr.off])
    out = {
        "tracing_overhead": _r(_med(_ratios(tr.on, tr.off))),
        "tracing_off_overhead": _r(off_overhead(tr.hooks_s, cpu_per_msg), 4),
        "tracing_overhead_10pct": _r(_med(_ratios(tr.tenth, tr.off))),
        "tracing_overhead_unexported": (
            _r(_med(_ratios(tr.unexported, tr.off))) if tr.unexported else None
        ),
        "tracing_overhead_each": [_r(x) for x in _ratios(tr.on, tr.off)],
        "tracing_off_msgs_s": round(_med([s.msgs_s for s in tr.off])),
        "tracing_on_msgs_s": round(_med([s.msgs_s for s in tr.on])),
        "tracing_hooks_us_per_msg": _r(tr.hooks_s * 1e6),
        "tracing_hooks_on_us_per_msg": _r(tr.hooks_on_s * 1e6, 2),
        "tracing_exporter_cpu_us_per_delivery": (
            _r(tr.exporter_s * 1e6, 2) if tr.exporter_s is not None else None
        ),
        "tracing_export_us_per_delivery": _r(tr.export_s * 1e6, 2),
        "tracing_export_sdk_us_per_delivery": _r(tr.export_sdk_s * 1e6, 1),
        "tracing_off_cpu_s_per_10k": _r(_med([s.cpu_per_10k for s in tr.off])),
        "tracing_on_cpu_s_per_10k": _r(_med([s.cpu_per_10k for s in tr.on])),
    }
    for mode, runs in (("off", tr.off), ("on", tr.on), ("unexported", tr.unexported)):
        if not runs:
            continue
        for part in CPU_PARTS:
            value = _med([s.us_per_msg(part) for s in runs])
            out[f"tracing_{mode}_{part}_us_per_msg"] = _r(value, 1)
    if tr.bare_off:
        bare_cpu = _med([s.cpu_s / s.messages for s in tr.bare_off])
        out |= {
            "tracing_overhead_bare": _r(_med(_ratios(tr.bare_on, tr.bare_off))),
            "tracing_off_overhead_bare": _r(off_overhead(tr.hooks_s, bare_cpu), 4),
            "tracing_overhead_10pct_bare": _r(_med(_ratios(tr.bare_tenth, tr.bare_off))),
            "tracing_off_msgs_s_bare": round(_med([s.msgs_s for s in tr.bare_off])),
            "tracing_on_msgs_s_bare": round(_med([s.msgs_s for s in tr.bare_on])),
            "tracing_off_cpu_s_per_10k_bare": _r(_med([s.cpu_per_10k for s in tr.bare_off])),
            "tracing_on_cpu_s_per_10k_bare": _r(_med([s.cpu_per_10k for s in tr.bare_on])),
        }
    return out


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


PARTS = ("throughput", "key_parallel", "wire", "retries", "tracing")
TRACING_MESSAGES = 20_000


def tracing_messages(args: argparse.Namespace) -> int:
    """Messages per run of the tracing part: ``--messages``, at most :data:`TRACING_MESSAGES`."""
    messages: int = args.messages
    return min(messages, TRACING_MESSAGES)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run, print the tables and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--messages", type=_positive, default=50_000, help="messages per run")
    parser.add_argument("--repeats", type=_positive, default=3, help="interleaved repeats")
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["faust", "faststream"], help="peers to leave out"
    )
    parser.add_argument(
        "--wire-messages",
        type=_positive,
        default=100_000,
        help="messages per run of the guarded-vs-bare part",
    )
    parser.add_argument(
        "--retry-messages",
        type=_positive,
        default=20_000,
        help="messages per retry run",
    )
    parser.add_argument(
        "--retry-unordered",
        action="store_true",
        help="run the retry part on a lane without per-key order (no parking), to tell the "
        "cost of parking from the cost of the retry itself",
    )
    parser.add_argument(
        "--hold-ms",
        type=float,
        default=1.0,
        help="how long the retry part's handler holds its key (a window for overlaps)",
    )
    parser.add_argument(
        "--count-every",
        type=_positive,
        default=1,
        help="the wire and tracing parts' handler writes its byte per message N at a time, so "
        "the harness's reader wakes once per N messages (default 1: every message, as the "
        "issue measures); N must divide the message count of each of the two parts that runs",
    )
    parser.add_argument(
        "--parts", nargs="+", default=list(PARTS), choices=PARTS, help="parts to run, in order"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short run: 5,000 messages, 2,000 per guarded and retry run, 1 repeat",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.wire_messages, args.retry_messages = 5_000, 2_000, 2_000
        args.repeats = 1
    counted = {"wire": args.wire_messages, "tracing": tracing_messages(args)}
    running = {part: n for part, n in counted.items() if part in args.parts}
    if any(n % args.count_every for n in running.values()):
        parts = " and ".join(f"the {part} part's {n}" for part, n in running.items())
        parser.error(f"--count-every {args.count_every} must divide {parts} messages")
    os.environ["BENCH_COUNT_EVERY"] = str(args.count_every)  # the consumers inherit it
    try:
        res = asyncio.run(run(args))
    except (
        BenchError,
        ProcessBenchError,
        PipelineError,
        KafkaException,
        redis_errors.RedisError,
        OSError,
    ) as exc:
        print(f"bench/runtime.py: error: {exc}", file=sys.stderr)
        return 1
    for warning in res.warnings:
        print(f"warning: cleanup: {warning}", file=sys.stderr)
    print_tables(res, args)
    print()
    print(json.dumps(summary(res, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
