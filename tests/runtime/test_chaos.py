"""Chaos: failures, retries and a kill -9 of a member in the middle of a run."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from redis.asyncio import Redis
from runtime.chaos_fate import fate
from runtime.helpers import declare, lane_spec
from support import delete_group_after

from pipeline import headers as h
from pipeline.envelope import Message, Record
from pipeline.transport.protocol import Transport

N, KEYS = 600, 30


async def _member(
    transport: Transport, topic: str, group: str, prefix: str
) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "CHAOS_TOPIC": topic,
        "CHAOS_PREFIX": prefix,
        "PIPELINE_RUNTIME__COMMIT_INTERVAL_MS": "100",
        "PIPELINE_KAFKA__SESSION_TIMEOUT_MS": "3000",
        "PIPELINE_REDIS__LEASE_MS": "1500",
        "PIPELINE_REDIS__HEARTBEAT_MS": "100",
        "PIPELINE_LOG_LEVEL": os.environ.get("CHAOS_LOG_LEVEL", "WARNING"),
    }
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pipeline",
        "consume",
        "runtime.chaos_app:app",
        "--group",
        group,
        "-t",
        transport.name,
        cwd=str(Path(__file__).parents[1]),
        env=env,
    )


async def _handled(redis: Redis, prefix: str) -> dict[str, list[int]]:
    out = {}
    for i in range(KEYS):
        out[f"k{i}"] = [int(x) for x in await redis.lrange(f"{prefix}:k{i}", 0, -1)]
    return out


async def test_every_event_ends_handled_or_dead_lettered_in_key_order(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """Under failures and a kill -9, every event is handled or dead-lettered, in key order.

    5% of events fail once (retryable), 1% fatally, and one of two members is killed mid-run;
    every event ends handled or in the DLQ with complete headers, and per key the handled
    order is the produced order.
    """
    spec = lane_spec(f"chaos_{unique}", 4, retry={"tiers": ["200ms", "400ms"], "max_attempts": 3})
    await declare(transport, spec)
    prefix, group = f"chaos-{unique}", f"g-{unique}"
    delete_group_after(transport, group, spec.topic_names())  # its members are processes
    members = [await _member(transport, spec.name, group, prefix) for _ in range(2)]
    producer = transport.producer()
    values = [f"k{i % KEYS}:{i}".encode() for i in range(N)]
    await producer.send_many(spec.name, [Record(v, v.split(b":")[0]) for v in values])
    await producer.close()
    fatal = {v for v in values if fate(v) == 99}
    dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
    dead: list[Message] = []
    try:
        killed = False
        deadline = asyncio.get_running_loop().time() + 90
        while True:
            handled = await _handled(redis, prefix)
            done = {f"{k}:{s}".encode() for k, seqs in handled.items() for s in seqs}
            if not killed and len(done) >= N // 4:
                members[0].send_signal(signal.SIGKILL)  # mid-run, mid-message
                await members[0].wait()
                members[0] = await _member(transport, spec.name, group, prefix)
                killed = True
            dead += await dlq.poll(100, 0.2)
            if killed and done | {m.value for m in dead} >= set(values):
                break
            missing = set(values) - done - {m.value for m in dead}
            assert asyncio.get_running_loop().time() < deadline, f"missing {sorted(missing)}"
    finally:
        for proc in members:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in members:
            await asyncio.wait_for(proc.wait(), 60)
        await dlq.close()
        for i in range(KEYS):
            await redis.delete(f"{prefix}:k{i}")
    assert fatal <= {m.value for m in dead}
    _check_dead_letters(dead, spec.name)
    _check_key_order(handled)


def _check_dead_letters(dead: list[Message], origin: str) -> None:
    for message in dead:
        assert message.headers[h.ORIGIN_TOPIC] == origin.encode()
        assert h.ORIGIN_OFFSET in message.headers
        assert message.headers[h.DEAD_REASON] in (b"fatal", b"sequenced", b"exhausted")
        if message.headers[h.DEAD_REASON] == b"fatal":
            assert message.headers[h.ERROR_CLASS] == b"pipeline.errors.DeadLetter"


def _check_key_order(handled: dict[str, list[int]]) -> None:
    for key, seqs in handled.items():
        first_seen = list(dict.fromkeys(seqs))  # redeliveries after the kill repeat a suffix
        assert first_seen == sorted(first_seen), f"order broken for {key}: {seqs}"
