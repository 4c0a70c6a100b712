"""By hand: the resident memory of a ``pipeline consume`` process fed distinct keys (not a test).

``.venv/bin/python tests/hostile/flood_rss.py MESSAGES CONVERSATIONS [PAUSE_S [ROUNDS]]`` declares
the lanes of :mod:`flood_app` on Kafka, starts ``pipeline consume`` on them (dynamic limits on),
feeds a warm-up batch, then ``ROUNDS`` floods (2 unless given) of ``MESSAGES`` messages each of
its own key and tenant and ``CONVERSATIONS`` conversations, and prints the process's ``VmRSS``
after the warm-up and after each flood has drained and the member idled for a few reap ticks
(and after ``PAUSE_S`` more, if not 0, before the next flood). With each figure go the process's
allocated blocks, C heap and GC-tracked objects grown by type since the warm-up; with
``FLOOD_TRACE_AFTER=N`` in the environment, ``tracemalloc`` runs from flood N's figures on and
the allocation sites grown over each later flood are printed; ``FLOOD_DYNAMIC=false`` runs the
member without the dynamic limits. Last, the ``VmRSS`` once cycles
are collected and the C heap trimmed (``malloc_trim``). Its topics, group and Redis keys are
deleted at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from redis import Redis as SyncRedis

from pipeline import headers as h
from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport
from pipeline.transport.protocol import Producer

sys.path.insert(0, str(Path(__file__).parents[1]))  # run as a script: tests/ holds its helpers
UNIQUE = os.environ.setdefault("FLOOD_UNIQUE", uuid.uuid4().hex[:10])  # names flood_app's lanes
from hostile.flood_app import DEBOUNCED, THROTTLED  # noqa: E402 - after the two lines above
from hostile.measure import rss_kib, say  # noqa: E402
from support import cli_environment, test_settings  # noqa: E402

WARM_UP = 5_000
IDLE_S = 15.0
SPECS: list[TopicSpec] = [THROTTLED, DEBOUNCED]
TRACE_AFTER = int(os.environ.get("FLOOD_TRACE_AFTER", "0"))
"""The flood after whose figures ``tracemalloc`` starts in the member (0: never)."""


def redis_kinds(url: str, unique: str) -> dict[str, tuple[int, int]]:
    """The run's Redis keys by kind (their name's part after the prefix): (count, without TTL)."""
    kinds: dict[str, tuple[int, int]] = {}
    with SyncRedis.from_url(url) as client:
        for name in client.scan_iter(match=f"*{unique}*", count=1000):
            text = name.decode(errors="replace").replace(unique, "U")
            kind = ":".join(part[:12] for part in text.split(":")[:3])
            count, lasting = kinds.get(kind, (0, 0))
            kinds[kind] = (count + 1, lasting + (client.pttl(name) < 0))
    return kinds


def lag(bootstrap: str, group: str, topics: list[str]) -> int:
    """Messages of ``topics`` the group has not committed yet."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        total = 0
        for topic in topics:
            parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            tps = [TopicPartition(topic, p) for p in parts]
            for tp in consumer.committed(tps, timeout=10):
                _, high = consumer.get_watermark_offsets(tp, timeout=10)
                total += high - max(tp.offset, 0)
        return total
    finally:
        consumer.close()


def keyed(n: int) -> Record:
    """Message ``n`` of the throttled lane: its own key and tenant."""
    return Record(b'{"n": %d}' % n, b"key-%d" % n, headers={h.TENANT: b"tenant-%d" % n})


def conversation(n: int) -> Record:
    """Message ``n`` of the debounced lane: its own key, tenant and conversation."""
    body = b'{"conversation_id": "conv-%d", "n": %d}' % (n, n)
    return Record(body, b"conv-%d" % n, headers={h.TENANT: b"tenant-c%d" % n})


async def probe(pid: int, path: Path, command: str) -> dict[str, Any]:
    """Ask the member (SIGUSR2, :func:`flood_app._probe`) for ``command``; its answer."""
    return await asyncio.to_thread(ask, pid, path, command)


def ask(pid: int, path: Path, command: str) -> dict[str, Any]:
    """:func:`probe`'s blocking part: the command written, the signal sent, the answer read."""
    answer = path.with_suffix(".json")
    answer.unlink(missing_ok=True)
    path.write_text(command)
    os.kill(pid, signal.SIGUSR2)
    for _ in range(1200):
        if answer.exists():
            figures: dict[str, Any] = json.loads(answer.read_text())
            return figures
        time.sleep(0.1)  # the member answers from its signal handler: a file, polled
    raise RuntimeError(f"member {pid} did not answer {command!r}")


def figures_line(stats: dict[str, Any], base: dict[str, Any]) -> str:
    """The member's heap and objects in ``stats``, and the types grown since ``base``."""
    heap = stats["heap"]
    grown = Counter(stats["types"])
    grown.subtract(base["types"])
    top = ", ".join(f"{name} {n:+d}" for name, n in grown.most_common(8) if n)
    mib = 1024 * 1024
    line = (
        f"  blocks {stats['blocks']} ({stats['blocks'] - base['blocks']:+d});"
        f" C heap arena {heap['arena'] / mib:.1f} MiB, in use {heap['uordblks'] / mib:.1f},"
        f" free {heap['fordblks'] / mib:.1f}, mmapped {heap['hblkhd'] / mib:.1f};"
        f" GC objects {sum(stats['types'].values())}, grown: {top or 'none'}"
    )
    for site, size, count in stats.get("sites", []):
        line += f"\n    {size / 1024:+.1f} KiB {count:+d} blocks {site}"
    if "traced" in stats:
        traced, own = stats["traced"] / mib, stats["tracing"] / mib
        line += f"\n    traced {traced:.1f} MiB, tracemalloc's own {own:.1f} MiB"
    return line


async def drained(bootstrap: str, group: str, topics: list[str], pid: int) -> int:
    """Wait until the group committed every message of ``topics``; the highest VmRSS meanwhile."""
    peak = rss_kib(pid)
    while lag(bootstrap, group, topics) > 0:
        peak = max(peak, rss_kib(pid))
        await asyncio.sleep(1)  # the broker is polled: nothing here can say when it is done
    return peak


async def flood(producer: Producer, round_: int, messages: int, conversations: int) -> None:
    """Send flood ``round_``: keys and conversations none of the earlier floods had."""
    keys = range(WARM_UP + round_ * messages, WARM_UP + (round_ + 1) * messages)
    talk = range(round_ * conversations, (round_ + 1) * conversations)
    for start in range(keys.start, keys.stop, 10_000):
        batch = range(start, min(start + 10_000, keys.stop))
        await producer.send_many(THROTTLED.name, [keyed(n) for n in batch])
    for start in range(talk.start, talk.stop, 10_000):
        batch = range(start, min(start + 10_000, talk.stop))
        await producer.send_many(DEBOUNCED.name, [conversation(n) for n in batch])


async def measure(
    producer: Producer,
    bootstrap: str,
    group: str,
    pid: int,
    sizes: tuple[int, int, float, int],
    probed: Path,
) -> None:
    """Warm the member up, then flood it ``rounds`` times; print VmRSS after each.

    ``sizes``: messages and conversations a flood, the pause after a flood before the next, and
    the rounds. ``probed``: the file the member reads its probe's command from.
    """
    messages, conversations, pause_s, rounds = sizes
    consumed = [n for spec in SPECS for n in spec.topic_names() if n != spec.dead_letter]
    await producer.send_many(THROTTLED.name, [keyed(n) for n in range(WARM_UP)])
    await drained(bootstrap, group, consumed, pid)
    await asyncio.sleep(IDLE_S)
    warm = rss_kib(pid)
    say(f"after warm-up of {WARM_UP}: VmRSS {warm} KiB")
    base = await probe(pid, probed, "stats")
    say(figures_line(base, base))
    for round_ in range(rounds):
        started = time.monotonic()
        await flood(producer, round_, messages, conversations)
        peak = await drained(bootstrap, group, consumed, pid)
        drained_s = time.monotonic() - started
        await asyncio.sleep(IDLE_S)
        idle = rss_kib(pid)
        say(
            f"flood {round_ + 1}: {messages} keys/tenants + {conversations} conversations"
            f" drained in {drained_s:.0f} s; VmRSS peak {peak} KiB, idle after"
            f" {IDLE_S:.0f} s {idle} KiB ({idle - warm:+d} KiB on the warm-up)"
        )
        say(figures_line(await probe(pid, probed, "stats"), base))
        if round_ + 1 == TRACE_AFTER:
            await probe(pid, probed, "trace")
        if pause_s and round_ < rounds - 1:
            await asyncio.sleep(pause_s)
            paused = rss_kib(pid)
            say(f"after a pause of {pause_s:.0f} s: VmRSS {paused} KiB ({paused - warm:+d} KiB)")
    trim = await probe(pid, probed, "trim")
    await asyncio.sleep(1)  # the kernel's count of the pages handed back
    trimmed = rss_kib(pid)
    say(
        f"after gc.collect() ({trim['collected']} objects) and malloc_trim(0):"
        f" VmRSS {trimmed} KiB ({trimmed - warm:+d} KiB on the warm-up)"
    )


def clean_up(settings: Settings, group: str) -> None:
    """Delete the run's group, topics and Redis keys."""
    admin = AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})
    for _ in range(30):  # the group empties once the broker saw the member leave
        try:
            for future in admin.delete_consumer_groups([group]).values():
                future.result()
            break
        except KafkaException:
            time.sleep(1)
    for future in admin.delete_topics([n for s in SPECS for n in s.topic_names()]).values():
        future.result()
    with SyncRedis.from_url(settings.redis.url) as client:
        names = list(client.scan_iter(match=f"*{UNIQUE}*", count=1000))
        for at in range(0, len(names), 500):
            client.unlink(*names[at : at + 500])


async def main(messages: int, conversations: int, pause_s: float = 0.0, rounds: float = 2) -> None:
    """Run the measurement and print its figures."""
    settings = test_settings()
    group = f"g-{UNIQUE}"
    transport = create_transport(settings, "kafka")
    await apply(transport.admin(), SPECS, 100_000, dry_run=False)
    producer = transport.producer()
    with tempfile.TemporaryDirectory() as tmp:
        env = cli_environment(
            Path(tmp),
            FLOOD_UNIQUE=UNIQUE,
            FLOOD_PROBE=str(Path(tmp) / "probe"),
            PIPELINE_REDIS__KEY_PREFIX=f"t{UNIQUE}",
            PIPELINE_THROTTLE__DYNAMIC__ENABLED=os.environ.get("FLOOD_DYNAMIC", "true"),
            PIPELINE_THROTTLE__DYNAMIC__INTERVAL_S="1",
            PIPELINE_LOG_LEVEL="WARNING",
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "pipeline", "consume", "hostile.flood_app:app", "--group", group),
            *("-t", "kafka"),
            cwd=str(Path(__file__).parents[1]),
            env=env,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            bootstrap = settings.kafka.bootstrap_servers
            sizes = (messages, conversations, pause_s, int(rounds))
            probed = Path(tmp) / "probe"
            await measure(producer, bootstrap, group, process.pid, sizes, probed)
            kinds = redis_kinds(settings.redis.url, UNIQUE)
            say(
                f"Redis keys of the run: {sum(c for c, _ in kinds.values())}, without a TTL:"
                f" {sum(n for _, n in kinds.values())}"
            )
        finally:
            process.terminate()
            await process.wait()
            await producer.close()
            await transport.close()
            clean_up(settings, group)


if __name__ == "__main__":
    asyncio.run(main(*(int(a) for a in sys.argv[1:3]), *(float(a) for a in sys.argv[3:5])))
