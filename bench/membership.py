"""Group membership through a crash loop and a rolling restart, on both transports.

``make bench-membership`` runs, per transport, three ``pipeline consume`` members with default
settings (no ``--instance``: each takes its stable name from the host name and a free slot) on
one lane of 12 partitions, under a steady paced load (``--rate`` messages/s over many keys):

1. **crash loop**: every ``--kill-every-s`` seconds for ``--crash-s`` seconds, one member (in
   turn) is killed with SIGKILL and a replacement is started at once, as an orchestrator would;
2. **rolling restart**: each member in turn gets SIGTERM, its replacement starts when it has
   exited, and the next one goes when the replacement's ``/readyz`` answers plus ``--settle-s``;
3. **drain**: the load stops, and the run ends when every message was handled (at most
   ``--drain-s``).

Kafka runs on a private single-node broker started from ``deploy/local/kafka`` (its jars cached
by ``deploy/local/kafka.sh``), Redis on a private ``redis-server``; both are stopped at the end.

Figures: a **stall** is a time with work waiting (a message produced and not yet handled) and no
handler run. ``*_longest_stall_s`` is the longest over the whole group (no run anywhere while
work waits, the issue's measure); ``*_longest_partition_stall_s`` the longest for one partition
(no run of that partition while it has work waiting), which is what a key on a dead member's
partition sees. **Moves** are changes of a partition's owner (by member name) during the rolling
restart, sampled every 100 ms. **Lost** are messages produced and never handled.

The last line is one JSON object: ``{"bench": "membership", "kafka_longest_stall_s": ...,
"redis_longest_stall_s": ..., "kafka_rolling_moves": ..., "redis_rolling_moves": ...,
"lost": ...}`` with the per-partition stalls beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from redis.asyncio import Redis

from pipeline.config import Settings, load_settings
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport
from pipeline.transport.redis_streams.keys import Keys, parse_partition_id

ROOT = Path(__file__).resolve().parents[1]
# The fault suite's private Kafka broker. Its `ingress` is tests/ingress (a namespace package),
# which bench/ingress.py would shadow: bench/ leaves the path while it is imported.
_bench_paths = [p for p in sys.path if Path(p or ".").resolve() == ROOT / "bench"]
sys.path[:] = [str(ROOT / "tests")] + [p for p in sys.path if p not in _bench_paths]
from faults.services import KafkaServer, free_port, kafka_libs, port_open  # noqa: E402

sys.path[:0] = _bench_paths

PARTITIONS = 12
MEMBERS = 3


@dataclass
class Run:
    """What one transport's run saw."""

    transport: str
    produced: dict[int, tuple[int, int]] = field(default_factory=dict)  # seq -> (ms, partition)
    runs: list[tuple[int, int, int]] = field(default_factory=list)  # (ms, partition, seq)
    moves: int = 0
    kills: int = 0
    phases: dict[str, float] = field(default_factory=dict)


def longest_stall_s(produced: list[int], runs: list[tuple[int, int]]) -> float:
    """Longest time with a message waiting and no run: ``produced`` ms, ``runs`` (ms, seq).

    A gap between two consecutive runs is a stall from the later of the first run and the
    oldest message still unhandled then (produced before the second run, first handled at or
    after it) until the second run. Messages never handled wait until the last run.
    """
    first_run: dict[int, int] = {}
    for ms, seq in sorted(runs):
        first_run.setdefault(seq, ms)
    times = sorted(ms for ms, _ in runs)
    if not times:
        return 0.0
    end = times[-1]
    waiting = sorted(
        (first_run.get(seq, end + 1), produced_ms) for seq, produced_ms in enumerate(produced)
    )
    firsts = [handled for handled, _ in waiting]
    suffix_min = [0] * (len(waiting) + 1)
    suffix_min[-1] = sys.maxsize
    for i in range(len(waiting) - 1, -1, -1):
        suffix_min[i] = min(waiting[i][1], suffix_min[i + 1])
    longest = 0
    start = min(produced) if produced else times[0]
    for before, after in zip([start, *times], times, strict=False):
        oldest = suffix_min[bisect.bisect_left(firsts, after)]
        if oldest < after:
            longest = max(longest, after - max(before, oldest))
    return longest / 1000


def stalls(run: Run) -> tuple[float, float]:
    """(group-wide, per-partition) longest stall of a run, in seconds."""
    seqs = sorted(run.produced)
    index = {seq: i for i, seq in enumerate(seqs)}
    produced = [run.produced[seq][0] for seq in seqs]
    group = longest_stall_s(produced, [(ms, index[seq]) for ms, _, seq in run.runs])
    per_partition = 0.0
    for partition in range(PARTITIONS):
        mine = [seq for seq in seqs if run.produced[seq][1] == partition]
        local = {seq: i for i, seq in enumerate(mine)}
        part_runs = [(ms, local[seq]) for ms, p, seq in run.runs if p == partition and seq in local]
        if mine:
            per_partition = max(
                per_partition,
                longest_stall_s([run.produced[seq][0] for seq in mine], part_runs),
            )
    return group, per_partition


class Members:
    """The group's member processes, started, killed and replaced as an orchestrator would."""

    def __init__(
        self, env: dict[str, str], group: str, log_path: Path, *, fresh_names: bool = False
    ) -> None:
        """Describe the members; none runs yet."""
        self.env = env
        self.fresh_names = fresh_names
        self.group = group
        self.log = log_path.open("ab")
        self.procs: list[asyncio.subprocess.Process | None] = [None] * MEMBERS
        self.ports = [0] * MEMBERS

    async def start(self, i: int) -> None:
        """Start member ``i`` (default settings: its name comes from the host and a slot)."""
        self.ports[i] = free_port()
        env = {**self.env, "PIPELINE_RUNTIME__METRICS_PORT": str(self.ports[i])}
        # The old default for comparison: a new name at every start, leaving on shutdown.
        fresh = ("--instance", f"m{uuid.uuid4().hex[:8]}") if self.fresh_names else ()
        self.procs[i] = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "pipeline", "consume", "membership_app:app"),
            *("--group", self.group, *fresh),
            cwd=ROOT / "bench", env=env, stdout=self.log, stderr=self.log,
        )  # fmt: skip

    async def ready(self, i: int, timeout_s: float = 60) -> None:
        """Wait until member ``i``'s ``/readyz`` answers 200 (it joined and polls)."""
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=1.0) as client:
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if port_open(self.ports[i]):
                        response = await client.get(f"http://127.0.0.1:{self.ports[i]}/readyz")
                        if response.status_code == 200:
                            return
                await asyncio.sleep(0.1)
        raise RuntimeError(f"member {i} not ready after {timeout_s}s")

    async def kill(self, i: int) -> None:
        """SIGKILL member ``i`` and reap it."""
        proc = self.procs[i]
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()

    async def stop(self, i: int, timeout_s: float = 60) -> None:
        """SIGTERM member ``i`` and wait for its graceful exit (SIGKILL past ``timeout_s``)."""
        proc = self.procs[i]
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            await self.kill(i)

    async def close(self) -> None:
        """Kill whatever still runs."""
        for i in range(MEMBERS):
            await self.kill(i)
        self.log.close()


async def owners(settings: Settings, group: str, topic: str) -> dict[int, str]:
    """Partition -> owning member name, as the broker or Redis sees it now."""
    if settings.transport == "redis":
        redis = Redis.from_url(settings.redis.url)
        try:
            raw = await redis.hgetall(Keys(settings.redis.key_prefix).owners(group))
        finally:
            await redis.aclose()
        out = {}
        for pid, value in raw.items():
            _, partition = parse_partition_id(pid.decode())
            out[partition] = value.decode().split("|")[0]
        return out
    return await asyncio.to_thread(_kafka_owners, settings, group, topic)


_admins: dict[str, Any] = {}


def _kafka_owners(settings: Settings, group: str, topic: str) -> dict[int, str]:
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415 - Kafka runs only

    bootstrap = settings.kafka.bootstrap_servers
    admin = _admins.get(bootstrap) or _admins.setdefault(
        bootstrap, AdminClient({"bootstrap.servers": bootstrap})
    )
    description = admin.describe_consumer_groups([group])[group].result(timeout=5)
    out = {}
    for member in description.members:
        name = member.group_instance_id or member.client_id
        for tp in member.assignment.topic_partitions:
            if tp.topic == topic:
                out[tp.partition] = name
    return out


async def settled(settings: Settings, group: str, topic: str, hold_s: float = 3.0) -> float:
    """Wait until every partition of the lane has an owner, unchanged for ``hold_s``.

    A member's ``/readyz`` only says it polls; after a crash loop a replacement may still wait
    for the broker to release its name, and a rolling restart measured then would count that
    settling as moves. Returns the seconds waited (at most 120).
    """
    started = time.monotonic()
    stable_since, last = time.monotonic(), {}
    while time.monotonic() - started < 120:
        try:
            now = await owners(settings, group, topic)
        except Exception:
            now = {}
        if now != last or len(now) != PARTITIONS:
            stable_since, last = time.monotonic(), now
        elif time.monotonic() - stable_since >= hold_s:
            break
        await asyncio.sleep(0.2)
    else:
        print(f"group {group} did not settle: owners {last}", file=sys.stderr)
    return time.monotonic() - started


async def count_moves(
    settings: Settings, group: str, topic: str, stop: asyncio.Event, run: Run
) -> None:
    """Count owner changes of each partition until ``stop`` (a partition unowned for a while
    and taken back by its owner did not move)."""
    last: dict[int, str] = {}
    while not stop.is_set():
        try:
            now = await owners(settings, group, topic)
        except Exception as exc:
            print(f"owner sample failed: {exc}", file=sys.stderr)
            now = {}
        for partition, owner in now.items():
            if partition in last and last[partition] != owner:
                run.moves += 1
            last[partition] = owner
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


async def produce(
    settings: Settings, topic: str, rate: float, stop: asyncio.Event, run: Run
) -> None:
    """Produce ``rate`` messages/s over 1,000 keys until ``stop``, recording each send time."""
    transport = create_transport(settings)
    producer = transport.producer()
    seq = 0
    started = time.monotonic()
    try:
        while not stop.is_set():
            due = started + seq / rate
            if due > time.monotonic():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), due - time.monotonic())
                continue
            sent_ms = int(time.time() * 1000)
            key = f"k{random.randrange(1000)}".encode()
            receipt = await producer.send(topic, str(seq).encode(), key=key)
            run.produced[seq] = (sent_ms, receipt.partition)
            seq += 1
    finally:
        await producer.close()
        await transport.close()


async def read_runs(redis: Redis, key: str) -> list[tuple[int, int, int]]:
    """Every handler run recorded so far: (ms, partition, seq)."""
    out = []
    for raw in await redis.lrange(key, 0, -1):
        ms, partition, seq = raw.decode().split(":")
        out.append((int(ms), int(partition), int(seq)))
    return out


async def prepare(
    args: argparse.Namespace, name: str, redis_url: str, bootstrap: str | None, work: Path
) -> tuple[Settings, str, str, dict[str, str]]:
    """Declare the lane; returns the settings, the lane, the runs key and the members' env."""
    unique = uuid.uuid4().hex[:8]
    lane = f"membership_{unique}"
    topics = work / f"topics-{name}"
    topics.mkdir(parents=True)
    spec = {"name": lane, "partitions": PARTITIONS, "retry": {"tiers": ["1s"]}}
    (topics / f"{lane}.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    kafka = {"bootstrap_servers": bootstrap} if bootstrap else {}
    settings = load_settings(transport=name, redis={"url": redis_url}, kafka=kafka)
    transport = create_transport(settings)
    await apply(transport.admin(), [TopicSpec.model_validate(spec)], 1_000_000, dry_run=False)
    await transport.close()
    runs_key = f"membership:{unique}:runs"
    env = {
        **os.environ,
        "PIPELINE_TRANSPORT": name,
        "PIPELINE_REDIS__URL": redis_url,
        "PIPELINE_TOPICS_DIR": str(topics),
        "PIPELINE_MEMBERSHIP__SLOT_DIR": str(work / "slots"),
        "PIPELINE_LOG_LEVEL": os.environ.get("MEMBERSHIP_LOG_LEVEL", "WARNING"),
        "MEMBERSHIP_LANE": lane,
        "MEMBERSHIP_RUNS": runs_key,
        "MEMBERSHIP_REDIS_URL": redis_url,
    }
    if bootstrap:
        env["PIPELINE_KAFKA__BOOTSTRAP_SERVERS"] = bootstrap
    if args.protocol:
        env["PIPELINE_KAFKA__GROUP_PROTOCOL"] = args.protocol
    if args.fresh_names:
        env["PIPELINE_MEMBERSHIP__SHUTDOWN"] = "leave"
    return settings, lane, runs_key, env


async def crash_loop(args: argparse.Namespace, members: Members, run: Run) -> None:
    """SIGKILL one member in turn every period and start its replacement at once."""
    started = time.monotonic()
    victim = 0
    while time.monotonic() - started < args.crash_s:
        await asyncio.sleep(args.kill_every_s)  # the pace of the kills, not a synchronisation
        await members.kill(victim)
        await members.start(victim)
        run.kills += 1
        victim = (victim + 1) % MEMBERS
    for i in range(MEMBERS):
        await members.ready(i)
    run.phases["crash_loop_s"] = time.monotonic() - started


async def rolling_restart(
    args: argparse.Namespace, members: Members, settings: Settings, group: str, lane: str, run: Run
) -> None:
    """SIGTERM each member in turn, start its replacement, and count partition moves."""
    started = time.monotonic()
    stop = asyncio.Event()
    mover = asyncio.create_task(count_moves(settings, group, lane, stop, run))
    try:
        await asyncio.sleep(1.0)  # the mover's first samples are the baseline
        for i in range(MEMBERS):
            await members.stop(i)
            await members.start(i)
            await members.ready(i)
            await asyncio.sleep(args.settle_s)  # as a deployment's minReadySeconds
    finally:
        stop.set()
        await mover
    run.phases["rolling_s"] = time.monotonic() - started


async def drain(args: argparse.Namespace, redis: Redis, runs_key: str, run: Run) -> None:
    """Wait until every produced message was handled (at most ``--drain-s``)."""
    started = time.monotonic()
    while time.monotonic() - started < args.drain_s:
        handled = {seq for _, _, seq in await read_runs(redis, runs_key)}
        if handled >= set(run.produced):
            break
        await asyncio.sleep(0.5)
    run.phases["drain_s"] = time.monotonic() - started


async def run_transport(
    args: argparse.Namespace, name: str, redis_url: str, bootstrap: str | None, work: Path
) -> Run:
    """One transport's crash loop, rolling restart and drain."""
    run = Run(name)
    settings, lane, runs_key, env = await prepare(args, name, redis_url, bootstrap, work)
    group = f"g-{lane}"
    members = Members(env, group, work / f"members-{name}.log", fresh_names=args.fresh_names)
    redis = Redis.from_url(redis_url)
    stop_load = asyncio.Event()
    load: asyncio.Task[None] | None = None
    try:
        for i in range(MEMBERS):
            await members.start(i)
        for i in range(MEMBERS):
            await members.ready(i)
        load = asyncio.create_task(produce(settings, lane, args.rate, stop_load, run))
        await crash_loop(args, members, run)
        run.phases["settling_s"] = await settled(settings, group, lane)
        await rolling_restart(args, members, settings, group, lane, run)
        stop_load.set()
        await load
        await drain(args, redis, runs_key, run)
        run.runs = await read_runs(redis, runs_key)
    finally:
        stop_load.set()
        if load is not None and not load.done():
            await load
        await members.close()
        if args.logs is not None:
            args.logs.mkdir(parents=True, exist_ok=True)
            log = work / f"members-{name}.log"
            (args.logs / log.name).write_bytes(log.read_bytes())
        await redis.delete(runs_key)
        await redis.aclose()
    return run


async def main(args: argparse.Namespace) -> None:
    """Run the chosen transports and print the figures."""
    figures: dict[str, Any] = {"bench": "membership"}
    lost = 0
    with tempfile.TemporaryDirectory(prefix="pipeline-membership-") as tmp:
        work = Path(tmp)
        redis_port = free_port()
        redis_server = await asyncio.create_subprocess_exec(
            *("redis-server", "--port", str(redis_port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no"),
            stdout=asyncio.subprocess.DEVNULL,
        )
        kafka: KafkaServer | None = None
        try:
            while not port_open(redis_port):  # noqa: ASYNC110 - a child process's port
                await asyncio.sleep(0.05)
            redis_url = f"redis://127.0.0.1:{redis_port}/0"
            for name in args.transports:
                bootstrap = None
                if name == "kafka":
                    libs = kafka_libs()
                    if libs is None:
                        raise SystemExit("Kafka jars not cached: run `make services` first")
                    kafka = KafkaServer(work / "kafka", libs)
                    await asyncio.to_thread(kafka.start)
                    bootstrap = kafka.bootstrap_servers
                run = await run_transport(args, name, redis_url, bootstrap, work / name)
                group, partition = stalls(run)
                missing = set(run.produced) - {seq for _, _, seq in run.runs}
                lost += len(missing)
                print(
                    f"{name}: produced {len(run.produced)}, runs {len(run.runs)}, kills"
                    f" {run.kills}, longest stall {group:.2f}s (group) {partition:.2f}s"
                    f" (partition), rolling moves {run.moves}, lost {len(missing)}, phases"
                    f" { {k: round(v, 1) for k, v in run.phases.items()} }",
                    file=sys.stderr,
                )
                figures[f"{name}_longest_stall_s"] = round(group, 2)
                figures[f"{name}_longest_partition_stall_s"] = round(partition, 2)
                figures[f"{name}_rolling_moves"] = run.moves
                if kafka is not None:
                    await asyncio.to_thread(kafka.stop)
                    kafka = None
        finally:
            if kafka is not None:
                await asyncio.to_thread(kafka.stop)
            redis_server.send_signal(signal.SIGKILL)
            await redis_server.wait()
    figures["lost"] = lost
    print(json.dumps(figures))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transports", nargs="+", default=["kafka", "redis"])
    parser.add_argument("--rate", type=float, default=100.0, help="messages per second")
    parser.add_argument("--crash-s", type=float, default=60.0, help="length of the crash loop")
    parser.add_argument("--kill-every-s", type=float, default=4.0, help="one SIGKILL per period")
    parser.add_argument("--settle-s", type=float, default=5.0, help="pause after a ready member")
    parser.add_argument("--drain-s", type=float, default=90.0, help="longest wait at the end")
    parser.add_argument(
        "--protocol", choices=["auto", "consumer", "classic"], default=None,
        help="Kafka rebalance protocol (default: the setting's default, auto)",
    )  # fmt: skip
    parser.add_argument("--logs", type=Path, default=None, help="keep the members' logs here")
    parser.add_argument(
        "--fresh-names", action="store_true",
        help="the old default for comparison: a new member name at every start, leave on stop",
    )  # fmt: skip
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
