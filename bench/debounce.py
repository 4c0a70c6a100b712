"""Benchmark the coalescing debouncer: 10,000 conversations with bursty arrivals, several members.

The parent process plays the consumers recording messages (one ``Debouncer.record`` per
message, each conversation's messages in order); ``--members`` child processes each run a
``TurnRunner`` on the lane, as member processes would. Every conversation sends ``--bursts``
bursts of 1-6 messages with gaps inside a burst well below the quiet period, and the next burst
well after the previous one's turn is due. At the end the children report every turn.

Measured: lateness of each fired turn beyond its due time (Redis clock), Redis calls per
message (record + step + renew + blocking reads of the wake list, every process), turns per
burst (a burst split over two turns or two bursts merged into one both show), lost and
duplicated messages, and handler invocations saved against one invocation per message. The
same load runs twice: at the default rate and at three times it (the conversations start
within a third of ``--spread-s``; the ``_3x`` fields). Then three runners sit on an idle lane
for ``--idle-s`` and their Redis calls per second are counted (``idle_calls_per_s``).

    python bench/debounce.py [--conversations 10000] [--members 3] [--quiet-ms 1000]
    python bench/debounce.py --codec     # the buffered-message codec against JSON + base64

The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import percentile
from redis.asyncio import Redis

from pipeline.admission.debounce import Debouncer, Turn, TurnRunner
from pipeline.admission.debounce import keys as debounce_keys
from pipeline.admission.debounce.codec import BufferedMessage, decode, encode
from pipeline.envelope import Message
from pipeline.topics.spec import DebouncePolicy

PREFIX = "plbench"
MAX_BURST = 6


def member_main(
    url: str, lane: str, policy: dict[str, Any], tuning: tuple[int, int], stop: Any, out: Any
) -> None:
    """One member process: run a TurnRunner until ``stop`` is set, then report its turns."""
    asyncio.run(_member(url, lane, DebouncePolicy(**policy), tuning, stop, out))


async def _member(
    url: str, lane: str, policy: DebouncePolicy, tuning: tuple[int, int], stop: Any, out: Any
) -> None:
    client = Redis.from_url(url)
    debouncer = Debouncer(client, PREFIX, lane, policy, idle_ttl_ms=60_000)
    turns: list[tuple[str, list[str], tuple[int, ...]]] = []

    async def handle(turn: Turn) -> bool:
        turns.append((turn.key, [m.value.decode() for m in turn.messages], turn.arrivals_ms))
        await asyncio.sleep(random.uniform(0.002, 0.02))  # the handler's work
        return True

    batch_ms, pass_at = tuning
    runner = TurnRunner(debouncer, handle, max_concurrency=64, batch_ms=batch_ms, pass_at=pass_at)
    halt = asyncio.Event()
    task = asyncio.create_task(runner.run(halt))
    while debouncer.stats.redis_calls == 0:  # noqa: ASYNC110 - until the first claim is sent
        await asyncio.sleep(0.01)
    out.put("ready")
    await asyncio.to_thread(stop.wait)
    halt.set()
    await task
    await client.aclose()
    stats = debouncer.stats
    out.put(
        {
            "turns": turns,
            "lateness_ms": list(stats.lateness_ms),
            "redis_calls": stats.redis_calls,
            "stale": stats.stale,
            "lost_leases": stats.lost_leases,
        }
    )


def schedule(conversations: int, bursts: int, quiet_ms: int, spread_s: float) -> list[list[float]]:
    """Per conversation, per burst, the offsets (s) at which its messages arrive."""
    rng = random.Random(7)
    plan = []
    for _ in range(conversations):
        at = rng.uniform(0, spread_s)
        conversation = []
        for _ in range(bursts):
            times = [at]
            for _ in range(rng.randint(1, MAX_BURST) - 1):
                times.append(times[-1] + rng.uniform(0, quiet_ms / 3000))
            conversation.append(times)
            at = times[-1] + quiet_ms / 1000 + rng.uniform(1.0, 3.0)  # after the turn fired
        plan.append(conversation)
    return plan


def producer_main(
    url: str, lane: str, policy: dict[str, Any], plan: dict[int, Any], start: float, out: Any
) -> None:
    """One producer process: record its conversations' messages at their planned times."""
    out.put(asyncio.run(_produce(url, lane, DebouncePolicy(**policy), plan, start)))


async def _produce(
    url: str, lane: str, policy: DebouncePolicy, plan: dict[int, list[list[float]]], start: float
) -> dict[str, Any]:
    client = Redis.from_url(url, max_connections=32)
    debouncer = Debouncer(client, PREFIX, lane, policy, idle_ttl_ms=60_000)
    recorded: list[str] = []
    gate = asyncio.Semaphore(32)
    late_gaps = 0

    async def conversation(index: int, bursts: list[list[float]]) -> None:
        nonlocal late_gaps
        offset = 0
        for burst_no, burst in enumerate(bursts):
            previous = None
            for at in burst:
                await asyncio.sleep(max(0.0, start + at - time.time()))
                text = f"c{index}/b{burst_no}/m{offset}"
                async with gate:
                    await debouncer.record(
                        f"c{index}", Message("chat", 0, offset, None, text.encode())
                    )
                recorded.append(text)
                offset += 1
                # A producer that fell behind its plan splits a burst itself: count those gaps.
                now = time.time()
                late_gaps += previous is not None and now - previous > policy.quiet_s
                previous = now

    await asyncio.gather(*(conversation(i, b) for i, b in plan.items()))
    await client.aclose()
    stats = debouncer.stats
    return {
        "recorded": recorded,
        "late_gaps": late_gaps,
        "redis_calls": stats.redis_calls,
        "fail_open": stats.fail_open,
        "superseded": stats.superseded,
    }


async def drained(url: str, lane: str, policy: DebouncePolicy) -> None:
    """Wait until the lane has nothing buffered (its due set lives in Redis: poll it)."""
    client = Redis.from_url(url)
    debouncer = Debouncer(client, PREFIX, lane, policy)
    while await debouncer.next_due_ms() is not None:  # noqa: ASYNC110
        await asyncio.sleep(0.2)
    await client.aclose()


async def delete_lane(url: str, lane: str) -> None:
    """Delete every key the benchmark created for ``lane``."""
    client = Redis.from_url(url)
    names = [k async for k in client.scan_iter(match=f"{debounce_keys.lane_tag(PREFIX, lane)}*")]
    if names:
        await client.delete(*names)
    await client.aclose()


async def idle_calls(url: str, idle_s: float) -> float:
    """Redis calls per second of three runners on a lane that receives nothing."""
    lane = f"bench_idle_{uuid.uuid4().hex[:8]}"
    policy = DebouncePolicy(key="conversation_id", quiet_s=1.0, max_wait_s=10.0)
    clients = [Redis.from_url(url) for _ in range(3)]
    debouncers = [Debouncer(c, PREFIX, lane, policy) for c in clients]

    async def never(turn: Turn) -> bool:
        raise AssertionError(f"an idle lane ran a turn of {turn.key}")

    stop = asyncio.Event()
    tasks = [asyncio.create_task(TurnRunner(d, never).run(stop)) for d in debouncers]
    await asyncio.sleep(1.0)  # started: each made its first claim and blocks on the wake list
    before = sum(d.stats.redis_calls for d in debouncers)
    started = time.monotonic()
    await asyncio.sleep(idle_s)
    calls = sum(d.stats.redis_calls for d in debouncers) - before
    elapsed_s = time.monotonic() - started
    stop.set()
    await asyncio.gather(*tasks)
    for client in clients:
        await client.aclose()
    await delete_lane(url, lane)
    print(f"idle lane, 3 runners: {calls} Redis calls in {elapsed_s:.1f} s")
    return calls / elapsed_s


def effective_bursts(arrivals: dict[str, list[tuple[int, str]]], quiet_ms: int) -> int:
    """Bursts as they reached Redis: a conversation's messages cut where a gap >= quiet."""
    count = 0
    for stamped in arrivals.values():
        stamped.sort()
        count += 1 + sum(1 for (a, _), (b, _) in itertools.pairwise(stamped) if b - a >= quiet_ms)
    return count


def run(args: argparse.Namespace, spread_s: float) -> dict[str, Any]:
    """Run the load once, its conversations starting within ``spread_s``; return its figures."""
    lane = f"bench_{uuid.uuid4().hex[:8]}"
    try:
        return run_lane(args, lane, spread_s)
    finally:
        asyncio.run(delete_lane(args.url, lane))


def run_lane(args: argparse.Namespace, lane: str, spread_s: float) -> dict[str, Any]:
    """Run the load once on ``lane``."""
    quiet_s = args.quiet_ms / 1000
    policy = DebouncePolicy(key="conversation_id", quiet_s=quiet_s, max_wait_s=quiet_s * 10)
    plan = schedule(args.conversations, args.bursts, args.quiet_ms, spread_s)
    messages = sum(len(b) for c in plan for b in c)
    bursts = sum(len(c) for c in plan)
    ctx = mp.get_context("spawn")
    stop, out, produced = ctx.Event(), ctx.Queue(), ctx.Queue()
    members = [
        ctx.Process(
            target=member_main,
            args=(args.url, lane, policy.model_dump(), (args.batch_ms, args.pass_at), stop, out),
        )
        for _ in range(args.members)
    ]
    for member in members:
        member.start()
    for _ in members:
        out.get(timeout=120)  # every member is claiming
    start = time.time() + 2.0
    producers = [
        ctx.Process(
            target=producer_main,
            args=(
                args.url,
                lane,
                policy.model_dump(),
                {i: c for i, c in enumerate(plan) if i % args.producers == p},
                start,
                produced,
            ),
        )
        for p in range(args.producers)
    ]
    for producer in producers:
        producer.start()
    results = [produced.get(timeout=600) for _ in producers]
    elapsed_s = time.time() - start
    asyncio.run(drained(args.url, lane, policy))
    stop.set()
    reports = [out.get(timeout=120) for _ in members]
    for process in (*members, *producers):
        process.join(timeout=60)

    delivered: dict[str, int] = {}
    arrivals: dict[str, list[tuple[int, str]]] = {}
    turns = merged = 0
    seen_bursts: dict[str, int] = {}
    for report in reports:
        for key, texts, arrivals_ms in report["turns"]:
            turns += 1
            burst_ids = {t.rsplit("/", 1)[0] for t in texts}
            merged += len(burst_ids) > 1
            for burst_id in burst_ids:
                seen_bursts[burst_id] = seen_bursts.get(burst_id, 0) + 1
            for text, arrival_ms in zip(texts, arrivals_ms, strict=True):
                delivered[text] = delivered.get(text, 0) + 1
                arrivals.setdefault(key, []).append((arrival_ms, text))
    split = sum(1 for n in seen_bursts.values() if n > 1)
    recorded = {text for r in results for text in r["recorded"]}
    lost = len(recorded - delivered.keys())
    duplicates = sum(n - 1 for n in delivered.values())
    real_bursts = effective_bursts(arrivals, args.quiet_ms)
    late_gaps = sum(r["late_gaps"] for r in results)
    lateness = sorted(x for r in reports for x in r["lateness_ms"])
    calls = sum(r["redis_calls"] for r in (*results, *reports))
    p99 = percentile(lateness, 99) if lateness else None
    print(
        f"{args.conversations} conversations, {bursts} planned bursts, {messages} messages "
        f"({sum(r['fail_open'] for r in results)} failed open) in {elapsed_s:.1f} s; "
        f"{args.producers} producers, {args.members} members; quiet {args.quiet_ms} ms"
    )
    print(
        f"gaps inside a planned burst that the producers stretched to >= quiet: {late_gaps}; "
        f"bursts as they reached Redis: {real_bursts}"
    )
    print(
        f"turns {turns}: planned bursts split {split}, turns holding two planned bursts {merged}, "
        f"duplicates {duplicates}, lost {lost}, lost leases "
        f"{sum(r['lost_leases'] for r in reports)}"
    )
    if lateness:
        print(
            f"lateness ms: p50 {statistics.median(lateness):.0f} p99 {p99} max {lateness[-1]}; "
            f"redis calls {calls} (records {messages})"
        )
    return {
        "lateness_p99_ms": p99,
        "redis_calls_per_msg": round(calls / messages, 3),
        "turns_per_burst": round(turns / real_bursts, 4),
        "turns_per_planned_burst": round(turns / bursts, 4),
        "lost": lost,
        "invocations_saved": round(1 - turns / messages, 3),
    }


def codec() -> dict[str, Any]:
    """Size and speed of the binary codec against JSON with base64, on a typical chat message."""
    message = BufferedMessage(
        "ai_turns",
        7,
        123_456_789,
        b"conversation-8f14e45f",
        json.dumps({"conversation_id": "8f14e45f", "text": "is the shop open on Sunday?"}).encode(),
        {"tenant": b"acme", "event-id": b"wamid.HBgLMTU1NTAxMjM0NTYVAgASGBQzQUJD"},
        1_764_460_000_000,
    )

    def to_json(m: BufferedMessage) -> bytes:
        b64 = base64.b64encode
        return json.dumps(
            {
                "t": m.topic,
                "p": m.partition,
                "o": m.offset,
                "k": None if m.key is None else b64(m.key).decode(),
                "v": b64(m.value).decode(),
                "h": {k: b64(v).decode() for k, v in m.headers.items()},
                "ts": m.timestamp_ms,
            },
            separators=(",", ":"),
        ).encode()

    def from_json(data: bytes) -> BufferedMessage:
        d = json.loads(data)
        b64 = base64.b64decode
        key = None if d["k"] is None else b64(d["k"])
        headers = {k: b64(v) for k, v in d["h"].items()}
        return BufferedMessage(d["t"], d["p"], d["o"], key, b64(d["v"]), headers, d["ts"])

    def per_op_us(fn: Any, arg: Any, n: int = 50_000) -> float:
        started = time.perf_counter()
        for _ in range(n):
            fn(arg)
        return (time.perf_counter() - started) / n * 1e6

    binary, text = encode(message), to_json(message)
    result = {
        "bench": "debounce-codec",
        "binary_bytes": len(binary),
        "json_base64_bytes": len(text),
        "binary_round_trip_us": round(per_op_us(encode, message) + per_op_us(decode, binary), 2),
        "json_round_trip_us": round(per_op_us(to_json, message) + per_op_us(from_json, text), 2),
    }
    assert from_json(text) == decode(binary) == message  # noqa: S101 - a self-check
    return result


def bench(args: argparse.Namespace) -> dict[str, Any]:
    """The default rate, three times the rate, then the idle lane."""
    result: dict[str, Any] = {"bench": "debounce"}
    result.update(run(args, args.spread_s))
    fast = run(args, args.spread_s / 3)
    result.update({f"{name}_3x": value for name, value in fast.items()})
    result["idle_calls_per_s"] = round(asyncio.run(idle_calls(args.url, args.idle_s)), 3)
    return result


def main() -> None:
    """Parse the arguments, run, print the summary as the last line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--url", default=os.environ.get("PIPELINE_REDIS__URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--bursts", type=int, default=2)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--quiet-ms", type=int, default=1000)
    parser.add_argument("--spread-s", type=float, default=90.0)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--batch-ms", type=int, default=10, help="the runners' step spacing")
    parser.add_argument("--pass-at", type=int, default=6, help="turns per step that pass it on")
    parser.add_argument("--codec", action="store_true", help="measure the codec only")
    args = parser.parse_args()
    result = codec() if args.codec else bench(args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
