"""The noisy neighbour through a member: a small tenant's wait while another tenant floods.

``bench/fairness.py`` measures the Redis throttle alone, on a pool of worker slots in one
process. It does not see what a small tenant waits when its messages share partitions with
another tenant's flood inside a real member: the partitions' read-ahead, their high-water
pause, per-key order and the throttle's deferrals all stand between a message and its handler
there. This benchmark runs what users run (``make bench-tenant-flood``):

* ``pipeline consume tenant_flood_app:app -c CONCURRENCY -t TRANSPORT`` as its own process, in a
  fresh directory holding ``topics/tenant_flood.yaml`` (``--partitions`` partitions, ``ordered:
  true``, ``retry: {tiers: [1s, 5s]}``, ``throttle: {keys: ["org:{tenant}"]}`` with the default
  limit of 10 per key) and ``bench/tenant_flood_app.py`` (a ``--handler-ms`` handler that writes
  each message's produce time and its own start time to a pipe the harness reads);
* a private ``redis-server`` per phase (``bench/lane_process.py``'s :class:`PrivateRedis`), so
  ``INFO commandstats`` before and after counts only that phase's calls. On ``--transport redis``
  the streams live there too: the figure then also holds the broker's work (producing, reading,
  acknowledging), the harness's produce calls included;
* messages produced with the project's own producer (``transport.producer()``), tenant in the
  ``pl-tenant`` header (``small`` or ``flood``), the produce time in the value.

Three phases, each on fresh topics (main, retry tiers, dead letter; declared with the transport's
admin API as ``pipeline topics apply`` does), a fresh group and a fresh Redis:

1. ``calm``: the small tenant alone, ``--small-rate`` messages/s over 20 keys for ``--phase-s``;
2. ``flood_many_keys``: the same, and ``--flood-at-s`` into it another tenant sends ``--flood``
   messages at once over as many keys;
3. ``flood_few_keys``: the same flood over ``--flood-keys-few`` keys, so it is a few long
   conversations that per-key order runs one message at a time.

Each phase starts with one warm-up message; the phase's clock starts when the member has handled
it (the group joined, the handler imported), not after a fixed sleep. After the last produce the
harness waits, with a deadline, until every message has been handled once, then stops the member
with SIGTERM and waits for it to exit.

A message's *wait* is its produce time to its handler's start. Per phase: the small tenant's p50,
p99 and max wait, how many of its messages waited over 100 ms, the flood's drain time (its first
produce to its last handler start) and Redis commands per message (commandstats after the member
exited minus once the warm-up was handled, over the phase's messages; the member's periodic calls
count too, so at a low rate they weigh more). The last line is one JSON object:
``calm_p99_ms``, ``flood_many_keys_p99_ms``, ``flood_few_keys_p99_ms``, ``isolation_many_keys`` and
``isolation_few_keys`` (the flood phase's small p99 / the calm one's), ``flood_many_keys_drain_s``,
``flood_few_keys_drain_s``, ``redis_calls_per_msg`` (every phase's commands over every phase's
messages), the per-phase figures and ``transport``.

Everything is removed at the end, on a failure or Ctrl-C too: the member (SIGTERM, SIGKILL after a
grace), the private Redis servers (throttle and parking keys, on Redis also the streams and
groups), the Kafka groups (once their member has left: a ``pipeline consume`` member is static and
keeps its slot until its session times out) and topics, the temporary directories.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import BenchError, percentile
from lane_process import PIPELINE_CLI, PrivateRedis, calls_between, log_tail, stop_process

from pipeline import headers
from pipeline.config import Settings, load_settings
from pipeline.envelope import Record
from pipeline.errors import GroupNotEmpty, PipelineError, UnknownTopic
from pipeline.testing.ports import free_port
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport

if TYPE_CHECKING:
    from pipeline.envelope import Delivered
    from pipeline.transport.protocol import Admin, Producer

HERE = Path(__file__).resolve().parent
APP_MODULE = "tenant_flood_app"
LANE = "tenant_flood"
TIERS = ["1s", "5s"]
SMALL_KEYS = 20
PAD = b"x" * 100
SLOW_MS = 100.0
START_LIMIT_S = 90.0
"""How long the member may take to handle the warm-up message (start, join, first fetch)."""
DRAIN_LIMIT_S = 180.0
"""How long after the last produce every message must have been handled."""
TOPICS_LIMIT_S = 30.0
GROUP_PATIENCE_S = 30.0
"""How long, beyond the group's session timeout, a Kafka group is asked again to be deleted."""
HEAD = struct.Struct("<cqd")
"""A value's start: class (``W``, ``S``, ``F``), sequence, produce time; as the app reads it."""
RECORD = struct.Struct("<cqdd")
"""The app's record per message: the value's head and the handler's start."""


@dataclass(frozen=True, slots=True)
class PhasePlan:
    """One phase: its name and the flood (none for ``calm``)."""

    name: str
    flood: int
    flood_keys: int


@dataclass(slots=True)
class PhaseResult:
    """What one phase measured."""

    name: str
    small_waits_ms: list[float]
    small_by_second: list[tuple[int, float]]
    """Per second of produce time since the phase's start: (small messages, their p99 wait)."""
    flood_drain_s: float | None
    messages: int
    redis_calls: dict[str, int]
    duplicates: int

    @property
    def p50(self) -> float:
        """The small tenant's median wait (ms)."""
        return percentile(self.small_waits_ms, 50)

    @property
    def p99(self) -> float:
        """The small tenant's p99 wait (ms)."""
        return percentile(self.small_waits_ms, 99)

    @property
    def max(self) -> float:
        """The small tenant's longest wait (ms)."""
        return max(self.small_waits_ms, default=0.0)

    @property
    def slow(self) -> int:
        """Small messages that waited over :data:`SLOW_MS`."""
        return sum(1 for w in self.small_waits_ms if w > SLOW_MS)

    @property
    def calls_per_msg(self) -> float:
        """Redis commands per message of the phase."""
        return sum(self.redis_calls.values()) / self.messages

    def line(self) -> str:
        """The phase's figures on one line."""
        drain = (
            "" if self.flood_drain_s is None else f", flood drained in {self.flood_drain_s:.2f} s"
        )
        top = ", ".join(
            f"{name} {n / self.messages:.2f}"
            for name, n in sorted(self.redis_calls.items(), key=lambda kv: -kv[1])[:4]
        )
        return (
            f"{self.name}: small n={len(self.small_waits_ms)} p50 {self.p50:.1f} ms, p99 "
            f"{self.p99:.1f} ms, max {self.max:.1f} ms, {self.slow} over {SLOW_MS:.0f} ms{drain};"
            f" redis {self.calls_per_msg:.2f} calls/msg ({top}); duplicates {self.duplicates}"
        )


class Records(threading.Thread):
    """Reads the handler's pipe until EOF; keeps each message's first record.

    Sets ``warm`` at the first warm-up record and ``done`` once ``expected`` distinct small and
    flood messages were handled (both through the loop, from this thread).
    """

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        """Read ``fd``; ``loop`` owns the events."""
        super().__init__(daemon=True)
        self.fd = fd
        self.loop = loop
        self.seen: dict[tuple[bytes, int], tuple[float, float]] = {}
        self.duplicates = 0
        self.expected: int | None = None
        self.warm = asyncio.Event()
        self.done = asyncio.Event()
        self._lock = threading.Lock()

    def expect(self, count: int) -> None:
        """Set ``done`` once ``count`` small and flood messages were handled."""
        with self._lock:
            self.expected = count
            if self._handled() >= count:
                self.done.set()

    def _handled(self) -> int:
        return sum(1 for kind, _ in self.seen if kind != b"W")

    def run(self) -> None:
        """Parse records until the writer is gone."""
        pending = b""
        handled = 0
        while chunk := os.read(self.fd, 65536):
            pending += chunk
            whole = len(pending) - len(pending) % RECORD.size
            with self._lock:
                for offset in range(0, whole, RECORD.size):
                    kind, seq, produced, start = RECORD.unpack_from(pending, offset)
                    if (kind, seq) in self.seen:
                        self.duplicates += 1
                        continue
                    self.seen[kind, seq] = (produced, start)
                    if kind == b"W":
                        self.loop.call_soon_threadsafe(self.warm.set)
                    else:
                        handled += 1
                if self.expected is not None and handled >= self.expected:
                    self.loop.call_soon_threadsafe(self.done.set)
            pending = pending[whole:]

    def of(self, kind: bytes) -> list[tuple[float, float]]:
        """(produce time, handler start) of every ``kind`` message handled."""
        with self._lock:
            return [times for (k, _), times in self.seen.items() if k == kind]


# -- the lane and its broker ------------------------------------------------------------------


def lane_spec(topic: str, partitions: int) -> dict[str, Any]:
    """The lane users run: ordered, retry tiers, a throttle per tenant (default limit)."""
    return {
        "name": topic,
        "partitions": partitions,
        "lane": LANE,
        "ordered": True,
        "retry": {"tiers": TIERS},
        "throttle": {"keys": ["org:{tenant}"]},
    }


def write_lane(workdir: Path, spec: dict[str, Any]) -> None:
    """``topics/<name>.yaml`` (JSON is YAML) and the app module, for ``pipeline consume``."""
    (workdir / "topics").mkdir(parents=True)
    (workdir / "topics" / f"{spec['name']}.yaml").write_text(json.dumps(spec), encoding="utf-8")
    shutil.copyfile(HERE / f"{APP_MODULE}.py", workdir / f"{APP_MODULE}.py")


async def declare(admin: Admin, spec: TopicSpec, max_len: int) -> None:
    """Create the lane's topics as ``pipeline topics apply`` does; wait until all are listed."""
    await apply(admin, [spec], max_len, dry_run=False)
    names = spec.topic_names()
    deadline = time.monotonic() + TOPICS_LIMIT_S
    while True:
        listed = await admin.list_topics(names)
        if all(n in listed and listed[n].partitions == spec.partitions for n in names):
            return
        if time.monotonic() > deadline:
            raise BenchError(f"topics {names} not all listed {TOPICS_LIMIT_S:.0f} s after apply")
        await asyncio.sleep(0.1)


def message(kind: bytes, seq: int, key: str, tenant: bytes) -> Record:
    """A message stamped with its produce time now."""
    value = HEAD.pack(kind, seq, time.time()) + PAD
    return Record(value, key.encode(), {headers.TENANT: tenant})


# -- the Kafka leftovers --------------------------------------------------------------------------


@dataclass(slots=True)
class KafkaLeftovers:
    """Kafka groups and topics of finished phases, deleted at the end (groups first)."""

    groups: list[tuple[str, list[str]]] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)

    async def delete(self, settings: Settings) -> list[str]:
        """Delete them; the ones that could not be deleted, with why."""
        left: list[str] = []
        transport = create_transport(settings, "kafka")
        admin = transport.admin()
        patience_s = settings.kafka.session_timeout_ms / 1000 + GROUP_PATIENCE_S
        try:
            for group, topics in self.groups:
                deadline = time.monotonic() + patience_s
                while True:
                    try:
                        await admin.delete_group(group, topics)
                        break
                    except GroupNotEmpty:  # a static member's session is still running out
                        if time.monotonic() > deadline:
                            left.append(f"group {group}: still has members")
                            break
                        await asyncio.sleep(1.0)
                    except PipelineError as exc:
                        left.append(f"group {group}: {exc}")
                        break
            for topic in self.topics:
                try:
                    await admin.delete_topic(topic)
                except UnknownTopic:
                    pass
                except PipelineError as exc:
                    left.append(f"topic {topic}: {exc}")
        finally:
            await admin.close()
            await transport.close()
        self.groups.clear()
        self.topics.clear()
        return left


# -- one phase ------------------------------------------------------------------------------------


class Phase:
    """One phase's run: its directory, Redis, topics, member and producer."""

    def __init__(
        self,
        args: argparse.Namespace,
        settings: Settings,
        plan: PhasePlan,
        leftovers: KafkaLeftovers,
    ) -> None:
        """Nothing starts yet."""
        self.args = args
        self.plan = plan
        self.leftovers = leftovers
        run = uuid.uuid4().hex[:10]
        self.topic = f"bench_tenant_flood_{plan.name}_{run}"
        self.group = f"bench_tenant_flood_{run}"
        self.workdir = Path(tempfile.mkdtemp(prefix="bench-tenant-flood-"))
        self.redis = PrivateRedis(self.workdir / "redis")
        self.spec = lane_spec(self.topic, args.partitions)
        redis_settings = settings.redis.model_copy(update={"url": self.redis.url})
        self.settings = settings.model_copy(update={"redis": redis_settings})
        self.member: subprocess.Popen[bytes] | None = None
        self.log = self.workdir / "member.log"

    def env(self, write_fd: int) -> dict[str, str]:
        """The member's environment: the usual settings, a private Redis, the lane's handler."""
        return {
            **os.environ,
            "PIPELINE_TRANSPORT": self.args.transport,
            "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": self.settings.kafka.bootstrap_servers,
            "PIPELINE_REDIS__URL": self.redis.url,
            "PIPELINE_RUNTIME__METRICS_PORT": str(free_port()),
            "PIPELINE_MEMBERSHIP__SLOT_DIR": str(self.workdir / "slots"),
            "BENCH_LANE": LANE,
            "BENCH_OUT_FD": str(write_fd),
            "BENCH_HANDLER_MS": str(self.args.handler_ms),
        }

    def start_member(self, write_fd: int) -> None:
        """``pipeline consume`` in the phase's directory, in a session of its own."""
        cmd = [
            str(PIPELINE_CLI),
            "consume",
            f"{APP_MODULE}:app",
            "--group",
            self.group,
            "-c",
            str(self.args.concurrency),
            "-t",
            self.args.transport,
        ]
        with self.log.open("wb") as log:
            self.member = subprocess.Popen(
                cmd,
                cwd=self.workdir,
                env=self.env(write_fd),
                pass_fds=(write_fd,),
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )

    async def wait(self, event: asyncio.Event, limit_s: float, what: str, records: Records) -> None:
        """Until ``event`` is set; BenchError if the member exits or ``limit_s`` passes first."""
        deadline = time.monotonic() + limit_s
        while not event.is_set():
            if self.member is None or self.member.poll() is not None:
                raise BenchError(
                    f"{self.plan.name}: the member exited"
                    f" {self.member and self.member.returncode} before it handled {what}"
                    f"{log_tail(self.log)}"
                )
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{self.plan.name}: the member did not handle {what} within {limit_s:.0f} s "
                    f"({len(records.seen)} messages handled){log_tail(self.log)}"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), 0.2)

    async def run(self) -> PhaseResult:
        """Run the phase and remove what it made but the Kafka group and topics (see leftovers)."""
        transport = create_transport(self.settings, self.args.transport)
        admin = transport.admin()
        producer: Producer | None = None
        read_fd, write_fd = os.pipe()
        records = Records(read_fd, asyncio.get_running_loop())
        names = TopicSpec.model_validate(self.spec).topic_names()
        try:
            self.redis.start()
            if self.args.transport == "kafka":  # on Redis the topics go with the private server
                self.leftovers.topics.extend(names)
            await declare(admin, TopicSpec.model_validate(self.spec), self.settings.redis.max_len)
            write_lane(self.workdir, self.spec)
            producer = transport.producer()
            await producer.send_many(self.topic, [message(b"W", 0, "warm", b"small")])
            if self.args.transport == "kafka":
                self.leftovers.groups.append((self.group, names))
            self.start_member(write_fd)
            os.close(write_fd)
            write_fd = -1
            records.start()
            await self.wait(records.warm, START_LIMIT_S, "the warm-up message", records)
            before = self.redis.commandstats()
            sent = await self.produce(producer)
            records.expect(sent)
            await self.wait(records.done, DRAIN_LIMIT_S, f"all {sent} messages", records)
            self.stop_member()
            await asyncio.to_thread(records.join, 10)  # the records written before the exit
            calls = calls_between(before, self.redis.commandstats())
            return self.result(records, sent, calls)
        finally:
            self.stop_member()
            if write_fd >= 0:
                os.close(write_fd)
            if records.ident is not None:
                records.join(10)  # EOF once the member is gone
            if not records.is_alive():
                os.close(read_fd)
            if producer is not None:
                with contextlib.suppress(Exception):  # the broker may be what failed
                    await producer.close()
            await admin.close()
            await transport.close()
            self.redis.stop()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def stop_member(self) -> None:
        """SIGTERM to the member's session and wait for it (SIGKILL after a grace); once."""
        if self.member is not None and self.member.returncode is None:
            stop_process(self.member)

    async def produce(self, producer: Producer) -> int:
        """The small tenant paced over the phase, the flood at ``--flood-at-s``; messages sent."""
        args = self.args
        start = time.monotonic()
        small: int = round(float(args.small_rate) * float(args.phase_s))
        sends: list[asyncio.Task[list[Delivered]]] = []
        flooded = self.plan.flood == 0
        for i in range(small):
            due = start + i / args.small_rate
            if not flooded and due - start >= args.flood_at_s:
                await asyncio.sleep(max(0.0, start + args.flood_at_s - time.monotonic()))
                flood = [
                    message(b"F", j, f"f{j % self.plan.flood_keys}", b"flood")
                    for j in range(self.plan.flood)
                ]
                sends.append(asyncio.create_task(producer.send_many(self.topic, flood)))
                flooded = True
            await asyncio.sleep(max(0.0, due - time.monotonic()))  # pacing, not synchronisation
            record = message(b"S", i, f"s{i % SMALL_KEYS}", b"small")
            sends.append(asyncio.create_task(producer.send_many(self.topic, [record])))
        await asyncio.gather(*sends)
        return small + self.plan.flood

    def result(self, records: Records, sent: int, calls: dict[str, int]) -> PhaseResult:
        """The phase's figures from the records."""
        small = records.of(b"S")
        flood = records.of(b"F")
        zero = min(produced for produced, _ in small)
        by_second: dict[int, list[float]] = {}
        for produced, start in small:
            by_second.setdefault(int(produced - zero), []).append((start - produced) * 1000)
        drain = None
        if flood:
            drain = max(s for _, s in flood) - min(p for p, _ in flood)
        return PhaseResult(
            self.plan.name,
            [(start - produced) * 1000 for produced, start in small],
            [(len(w), percentile(w, 99)) for _, w in sorted(by_second.items())],
            drain,
            sent,
            calls,
            records.duplicates,
        )


# -- the run --------------------------------------------------------------------------------------


def plans(args: argparse.Namespace) -> list[PhasePlan]:
    """The three phases."""
    return [
        PhasePlan("calm", 0, 1),
        PhasePlan("flood_many_keys", args.flood, args.flood),
        PhasePlan("flood_few_keys", args.flood, args.flood_keys_few),
    ]


def summary(args: argparse.Namespace, results: dict[str, PhaseResult]) -> dict[str, object]:
    """The last line's object."""
    calm = results["calm"]
    many = results["flood_many_keys"]
    few = results["flood_few_keys"]
    calls = sum(sum(r.redis_calls.values()) for r in results.values())
    messages = sum(r.messages for r in results.values())
    out: dict[str, object] = {
        "bench": "tenant_flood",
        "transport": args.transport,
        "calm_p99_ms": round(calm.p99, 1),
        "flood_many_keys_p99_ms": round(many.p99, 1),
        "flood_few_keys_p99_ms": round(few.p99, 1),
        "isolation_many_keys": round(many.p99 / calm.p99, 1) if calm.p99 else None,
        "isolation_few_keys": round(few.p99 / calm.p99, 1) if calm.p99 else None,
        "flood_many_keys_drain_s": round(many.flood_drain_s or 0.0, 2),
        "flood_few_keys_drain_s": round(few.flood_drain_s or 0.0, 2),
        "redis_calls_per_msg": round(calls / messages, 2),
    }
    for name, r in results.items():
        out |= {
            f"{name}_p50_ms": round(r.p50, 1),
            f"{name}_max_ms": round(r.max, 1),
            f"{name}_over_100ms": r.slow,
            f"{name}_redis_calls_per_msg": round(r.calls_per_msg, 2),
        }
    out |= {
        "flood": args.flood,
        "flood_keys_few": args.flood_keys_few,
        "small_rate": args.small_rate,
        "phase_s": args.phase_s,
        "concurrency": args.concurrency,
        "handler_ms": args.handler_ms,
        "partitions": args.partitions,
    }
    return out


async def main(args: argparse.Namespace) -> dict[str, object]:
    """Every phase in turn, then the Kafka leftovers."""
    settings = load_settings()
    leftovers = KafkaLeftovers()
    results: dict[str, PhaseResult] = {}
    print(
        f"pipeline consume -c {args.concurrency} -t {args.transport}: ordered lane, retry tiers "
        f"{', '.join(TIERS)}, throttle org:{{tenant}} (limit {settings.throttle.default_limit}), "
        f"{args.handler_ms:g} ms handler, {args.partitions} partitions; small tenant "
        f"{args.small_rate:g}/s over {SMALL_KEYS} keys for {args.phase_s:g} s; flood "
        f"{args.flood:,} at {args.flood_at_s:g} s",
        file=sys.stderr,
        flush=True,
    )
    try:
        for plan in plans(args):
            result = await Phase(args, settings, plan, leftovers).run()
            results[plan.name] = result
            print(f"  {result.line()}", file=sys.stderr, flush=True)
            if plan.flood:
                seconds = " ".join(
                    f"{s}s:{n}/{p99:.0f}" for s, (n, p99) in enumerate(result.small_by_second)
                )
                print(f"    small per second (n/p99 ms): {seconds}", file=sys.stderr, flush=True)
    finally:
        if leftovers.groups or leftovers.topics:
            for problem in await leftovers.delete(settings):
                print(f"  cleanup: {problem}", file=sys.stderr, flush=True)
    return summary(args, results)


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--transport", choices=("kafka", "redis"), default="kafka")
    parser.add_argument("--flood", type=int, default=3_000, help="messages the flood sends at once")
    parser.add_argument("--flood-keys-few", type=int, default=5, help="keys of the few-keys flood")
    parser.add_argument("--small-rate", type=float, default=100.0, help="small tenant's msgs/s")
    parser.add_argument("--phase-s", type=float, default=16.0, help="small tenant's produce span")
    parser.add_argument("--flood-at-s", type=float, default=3.0, help="flood's time in a phase")
    parser.add_argument("--concurrency", type=int, default=32, help="pipeline consume -c")
    parser.add_argument("--handler-ms", type=float, default=20.0, help="handler's hold time")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of each topic")
    args = parser.parse_args()
    if min(args.flood, args.flood_keys_few, args.concurrency, args.partitions) < 1:
        parser.error("--flood, --flood-keys-few, --concurrency and --partitions must be at least 1")
    if args.small_rate <= 0 or args.phase_s <= 0 or args.handler_ms < 0:
        parser.error("--small-rate and --phase-s must be positive, --handler-ms not negative")
    if not 0 <= args.flood_at_s < args.phase_s:
        parser.error("--flood-at-s must fall within --phase-s")
    return args


def run() -> int:
    """Run the benchmark; the last line of stdout is the JSON object."""
    args = parse_args()
    try:
        result = asyncio.run(main(args))
    except BenchError as exc:
        print(f"bench/tenant_flood.py: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench/tenant_flood.py: interrupted; cleaned up", file=sys.stderr)
        return 130
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(run())
