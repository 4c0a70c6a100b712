"""Offload benchmark: 5 MiB payloads by reference against the largest inline payload.

Run: ``make bench-offload`` (= ``.venv/bin/python bench/offload.py``). Needs Redis (the
embedded default transport) and S3Proxy (``make services``); ``--store file`` uses a directory
instead, ``--transport kafka`` Kafka. Method and results: ``docs/benchmarks.md``.

Both modes run the same path in this process: signed Meta deliveries posted to the ingress ASGI
app (SQLite log store, ``synchronous=FULL``; 8 requests in flight) -> produced to one 4-partition
lane -> a :class:`~pipeline.runtime.member.Member` whose ``bytes`` handler reads the whole body
and checks its SHA-256 (off the loop, in both modes).

* **offload**: ``--offload-messages`` (default 40) bodies of 5 MiB; the lane declares
  ``offload: {above: 256KiB, store: s3://pipeline/bench-<run>}``: the ingress writes each body
  to S3Proxy and produces the reference; the handler gets a LazyPayload and reads it.
* **inline**: ``--inline-messages`` (default 200) bodies of the largest size a source may accept
  inline (``PIPELINE_MAX_MESSAGE_BYTES`` minus the ingress's 16 KiB headroom: 1,097,728 bytes by
  default), through a lane without offload.

Each repeat (``--repeats``, default 3) runs both modes, in alternating order, and measures the
loop's idle lateness first (``idle_loop_stall_p99_ms``: the shared machine's own noise); the
last line gives the median over repeats, and each repeat's ratio and stall beside it.
Each mode's time is ingress (first post to the last event acknowledged by the broker) plus
delivery (the member's start to the last handler return); ``bytes_per_s`` = payload bytes /
that time; ``vs_inline_bytes_per_s`` = offload / inline (so inline is scaled per byte).
``loop_stall_p99_ms``: while the member resolves (the delivery phase of offload), a task on its
event loop sleeps 1 ms in a loop and records how late each wake-up is; the p99 of that lateness.
``broker_bytes_per_msg``: value + key + headers of each message the handler received, mean, in
offload mode. Topics, groups and stored objects are deleted afterwards. The last line of output
is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import hmac
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import yaml

from pipeline.config import IngressSlotSettings, RuntimeSettings, load_settings
from pipeline.ingress.app import IngressApp
from pipeline.ingress.dispatch import Dispatcher
from pipeline.ingress.settings import load_sources
from pipeline.ingress.source import HEADROOM_BYTES, build_sources
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.offload.lazy import LazyPayload
from pipeline.offload.rows import offload_row
from pipeline.offload.store import open_store
from pipeline.offload.writer import Offloader, topic_policies
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport

SECRET = "bench-secret"  # noqa: S105 - the benchmark's own signing key
MIB = 1024 * 1024
IN_FLIGHT = 8
S3PROXY = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_ACCESS_KEY_ID": "pipeline",
    "AWS_SECRET_ACCESS_KEY": "pipeline-local-secret",
}


def body_of(n: int, size: int, run: str) -> bytes:
    """A distinct body of exactly ``size`` bytes."""
    head = f"{run}-{n:08d}-".encode()
    return head + b"x" * (size - len(head))


class LoopLag:
    """Records how late 1 ms sleeps wake up on the running loop."""

    def __init__(self) -> None:
        self.lags_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            self.lags_ms.append((time.perf_counter() - start - 0.001) * 1000)

    async def stop(self) -> float:
        if self._task is not None:
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return statistics.quantiles(self.lags_ms, n=100)[98] if len(self.lags_ms) > 100 else 0.0


async def run_mode(  # noqa: C901, PLR0915 - one measured pass, read top to bottom
    name: str,
    count: int,
    size: int,
    store_url: str | None,
    transport_name: str,
    tmp: Path,
    args_concurrency: int = 8,
) -> dict[str, Any]:
    settings = load_settings()
    run = uuid.uuid4().hex[:8]
    lane = f"bench_offload_{name}_{run}"
    fields: dict[str, Any] = {"name": lane, "partitions": 4, "ordered": False}
    if store_url:
        fields["offload"] = {"above": "256KiB", "store": store_url}
    spec = TopicSpec.model_validate(fields)
    transport = create_transport(settings, transport_name)  # type: ignore[arg-type]
    await apply(transport.admin(), [spec], 100_000, dry_run=False)
    sources_file = tmp / f"sources-{name}.yaml"
    source = {"scheme": "meta", "secrets": [SECRET], "topic": lane, "max_body_bytes": 64 * MIB}
    if store_url is None:
        source["max_body_bytes"] = settings.max_message_bytes - HEADROOM_BYTES
    sources_file.write_text(yaml.safe_dump({"sources": {"bench": source}}), encoding="utf-8")
    sources = build_sources(
        load_sources(sources_file, {lane}),
        [spec],
        admission=IngressSlotSettings(max_in_flight=64),
        max_message_bytes=settings.max_message_bytes,
    )
    log_store = SqliteLogStore(tmp / f"log-{name}.db", synchronous="FULL")
    await log_store.open()
    dispatcher = Dispatcher(transport.producer(), log_store)
    app = IngressApp(sources, log_store, dispatcher)
    if store_url:
        offloader = Offloader(topic_policies([spec]))
        app.offload = functools.partial(offload_row, offloader)
    bodies = [body_of(n, size, run) for n in range(count)]
    signatures = [
        "sha256=" + hmac.new(SECRET.encode(), b, hashlib.sha256).hexdigest() for b in bodies
    ]
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://ingress", timeout=120
    )
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def post(n: int) -> None:
        async with slots:
            answer = await http.post(
                "/hooks/bench",
                content=bodies[n],
                headers={"x-hub-signature-256": signatures[n]},
            )
            answer.raise_for_status()

    ingress_start = time.perf_counter()
    async with http:
        await asyncio.gather(*(post(n) for n in range(count)))
    await dispatcher.close()  # every accepted row produced (acknowledged by the broker)
    ingress_s = time.perf_counter() - ingress_start
    if dispatcher.counters.produced != count:
        raise RuntimeError(f"produced {dispatcher.counters.produced} of {count}")
    await log_store.close()
    expected = {hashlib.sha256(b).hexdigest() for b in bodies}
    bodies.clear()  # free the memory before the delivery phase

    member_app = App([spec])
    seen: list[int] = []
    wire: list[int] = []
    done = asyncio.Event()

    @member_app.handler(spec.lane)
    async def handle(event: LazyPayload | bytes, ctx: Context) -> None:
        if isinstance(event, LazyPayload):  # streamed; the payload checks size and digest
            size = sum([len(chunk) async for chunk in event.chunks()])
            digest = event.sha256
        else:
            size = len(event)
            digest = await asyncio.to_thread(lambda: hashlib.sha256(event).hexdigest())
        if digest not in expected:
            raise RuntimeError("a payload arrived altered")
        m = ctx.message
        headers = sum(len(k) + len(v) for k, v in m.headers.items())
        wire.append(len(m.value) + len(m.key or b"") + headers)
        seen.append(size)
        if len(seen) == count:
            done.set()

    group = f"bench-offload-{run}"
    member = Member(
        member_app,
        transport,
        group,
        RuntimeSettings(
            commit_interval_ms=200, max_concurrency=args_concurrency, shutdown_grace_s=5.0
        ),
    )
    lag = LoopLag()
    stop = asyncio.Event()
    delivery_start = time.perf_counter()
    lag.start()
    running = asyncio.create_task(member.run(stop))
    await asyncio.wait_for(done.wait(), 600)
    delivery_s = time.perf_counter() - delivery_start
    stall_p99_ms = await lag.stop()
    stop.set()
    await running
    await transport.admin().delete_group(group, spec.topic_names())
    for topic in spec.topic_names():
        await transport.admin().delete_topic(topic)
    await transport.close()
    total_bytes = count * size
    return {
        "mode": name,
        "messages": count,
        "payload_bytes": size,
        "ingress_s": round(ingress_s, 3),
        "delivery_s": round(delivery_s, 3),
        "bytes_per_s": round(total_bytes / (ingress_s + delivery_s)),
        "loop_stall_p99_ms": round(stall_p99_ms, 2),
        "loop_samples": len(lag.lags_ms),
        "broker_bytes_per_msg": round(statistics.fmean(wire)),
    }


async def idle_stall_p99_ms() -> float:
    """The loop's 1 ms wake-up lateness over 1 s with nothing else running (machine noise)."""
    idle = LoopLag()
    idle.start()
    await asyncio.sleep(1.0)
    return await idle.stop()


async def one_repeat(args: argparse.Namespace, repeat: int, tmp: Path) -> dict[str, Any]:
    """Inline then offload (offload first on odd repeats); the figures of this pair."""
    inline_size = load_settings().max_message_bytes - HEADROOM_BYTES
    prefix = uuid.uuid4().hex[:8]
    store_url = f"s3://pipeline/bench-{prefix}" if args.store == "s3" else f"file://{tmp}/{prefix}"
    idle_ms = await idle_stall_p99_ms()
    results: dict[str, dict[str, Any]] = {}
    order = ["inline", "offload"] if repeat % 2 == 0 else ["offload", "inline"]
    for mode in order:
        if mode == "inline":
            results[mode] = await run_mode(
                "inline", args.inline_messages, inline_size, None, args.transport, tmp
            )
        else:
            try:
                results[mode] = await run_mode(
                    "offload", args.offload_messages, 5 * MIB, store_url, args.transport, tmp
                )
            finally:
                store = open_store(store_url)
                for key in [o.key async for o in store.list()]:
                    await store.delete(key)
        print(json.dumps({"repeat": repeat, **results[mode]}), flush=True)
    inline, offload = results["inline"], results["offload"]
    return {
        "vs_inline_bytes_per_s": offload["bytes_per_s"] / inline["bytes_per_s"],
        "loop_stall_p99_ms": offload["loop_stall_p99_ms"],
        "broker_bytes_per_msg": offload["broker_bytes_per_msg"],
        "offload_bytes_per_s": offload["bytes_per_s"],
        "inline_bytes_per_s": inline["bytes_per_s"],
        "inline_loop_stall_p99_ms": inline["loop_stall_p99_ms"],
        "idle_loop_stall_p99_ms": idle_ms,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offload-messages", type=int, default=40)
    parser.add_argument("--inline-messages", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--store", choices=["s3", "file"], default="s3")
    parser.add_argument("--transport", choices=["redis", "kafka"], default="redis")
    args = parser.parse_args()
    for name, value in S3PROXY.items():
        os.environ.setdefault(name, value)
    with tempfile.TemporaryDirectory(prefix="bench-offload-") as tmp_name:
        pairs = [await one_repeat(args, r, Path(tmp_name)) for r in range(args.repeats)]
    summary = {field: round(statistics.median(p[field] for p in pairs), 2) for field in pairs[0]}
    summary["vs_inline_each"] = [round(p["vs_inline_bytes_per_s"], 2) for p in pairs]
    summary["loop_stall_p99_ms_each"] = [round(p["loop_stall_p99_ms"], 2) for p in pairs]
    print(
        json.dumps(
            {
                "bench": "offload",
                **summary,
                "repeats": args.repeats,
                "store": args.store,
                "transport": args.transport,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
