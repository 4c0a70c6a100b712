"""Metastable overload: clients that time out and retry, against the ingress and a saturated lane.

``make bench-metastable`` runs the same load twice on a real pipeline (``pipeline ingress serve``,
one ``pipeline consume`` member, Redis Streams on a private ``redis-server``):

* **naive**: the lane is a plain FIFO;
* **shed**: the lane has ``max_age`` = the clients' timeout and a ``sojourn`` limit
  (``on_expiry: drop``), so work whose caller has given up is dropped instead of served.

The lane's capacity is fixed: each message costs ``--service-ms`` of a downstream called at most
``--concurrency`` at a time. Clients arrive open-loop at ``--base`` requests/s (below capacity),
then at ``--spike`` requests/s for ``--spike-s`` seconds, then at ``--base`` again. A client
sends a signed webhook and gives up after ``--timeout-s``; if its work was not done by then it
sends it again as a new event, up to ``--attempts`` times, with no backoff (the retry storm of
the "Metastable failures" story). Goodput = attempts completed within their client's timeout,
per second of completion. The naive lane keeps serving work nobody waits for, so after the spike
its goodput stays near zero although the trigger is gone; the shedding lane recovers.

Output: ``docs/metastable.csv`` (per second and configuration: offered attempts, completions,
goodput), ``docs/metastable.png`` (if matplotlib is installed), and as the last line one JSON
object: ``{"bench": "metastable", "naive_recovered": ..., "shed_recovered": ...}`` where
``*_recovered`` is the mean goodput over the last half of the after-spike phase divided by the
base rate.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import hashlib
import hmac
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from ingress import free_port, port_open
from redis.asyncio import Redis

from pipeline.config import load_settings
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport

ROOT = Path(__file__).resolve().parents[1]
SECRET = "metastable-secret"  # noqa: S105 - a benchmark secret


async def wait_port(port: int, proc: asyncio.subprocess.Process, what: str) -> None:
    """Wait (60 s at most) until ``proc`` listens on ``port``."""
    deadline = time.monotonic() + 60
    while not port_open(port):
        if proc.returncode is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start")
        await asyncio.sleep(0.05)


@dataclass
class Run:
    """What one configuration measured (times in ms since the epoch)."""

    name: str
    started_ms: int = 0
    sends: dict[str, int] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)
    answered_ms: dict[str, int] = field(default_factory=dict)


def lane_spec(name: str, config: str, args: argparse.Namespace) -> dict[str, Any]:
    """The lane declaration of a configuration."""
    spec: dict[str, Any] = {"name": name, "partitions": 4, "ordered": False}
    if config == "shed":
        spec |= {
            "max_age": f"{args.max_age_ms}ms",
            "sojourn": {"target": f"{args.sojourn_ms}ms", "interval": "500ms"},
            "on_expiry": "drop",
        }
    return spec


def rate_at(args: argparse.Namespace, t_s: float) -> float:
    """Offered requests per second ``t_s`` seconds into the run."""
    if args.warm_s <= t_s < args.warm_s + args.spike_s:
        return float(args.spike)
    return float(args.base)


async def client(
    args: argparse.Namespace, run: Run, request: int, http: httpx.AsyncClient, redis: Redis
) -> None:
    """One caller: send, wait for the timeout, send again while the work is not done."""
    timeout_ms = int(args.timeout_s * 1000)
    for attempt in range(args.attempts):
        event_id = f"r{request}a{attempt}"
        sent_ms = int(time.time() * 1000)
        run.sends[event_id] = sent_ms
        body = json.dumps({"id": event_id, "key": f"r{request}"}).encode()
        signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        try:
            response = await http.post(
                "/hooks/hooks",
                content=body,
                headers={"x-hub-signature-256": signature},
                timeout=args.timeout_s,
            )
            if response.is_success:
                run.answered_ms[event_id] = int(time.time() * 1000) - sent_ms
        except httpx.HTTPError:
            pass  # an unanswered request is a timed-out request
        await asyncio.sleep(max(0.0, (sent_ms + timeout_ms) / 1000 - time.time()))
        done = await redis.hget(run.name + ":done", event_id)
        if done is not None and int(done) - sent_ms <= timeout_ms:
            return


async def drive(args: argparse.Namespace, run: Run, url: str, redis: Redis) -> None:
    """Open-loop arrivals for the whole run; each arrival is a :func:`client`."""
    total_s = args.warm_s + args.spike_s + args.after_s
    clients: set[asyncio.Task[None]] = set()
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, limits=limits) as http:
        began = time.monotonic()
        run.started_ms = int(time.time() * 1000)
        due, request, last = 0.0, 0, 0.0
        while (now := time.monotonic() - began) < total_s:
            due += rate_at(args, now) * (now - last)  # by elapsed time: a late tick catches up
            last = now
            while due >= 1:
                due -= 1
                task = asyncio.create_task(client(args, run, request, http, redis))
                clients.add(task)
                task.add_done_callback(clients.discard)
                request += 1
            await asyncio.sleep(0.01)  # the arrival clock's tick
        for task in list(clients):
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)


async def run_config(args: argparse.Namespace, config: str, directory: Path) -> Run:
    """Start a private pipeline with the configuration's lane and drive the load through it."""
    run = Run(config)
    unique = uuid.uuid4().hex[:8]
    lane = f"metastable_{unique}"
    redis_port, ingress_port = free_port(), free_port()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    topics = directory / "topics"
    topics.mkdir(parents=True)
    spec = lane_spec(lane, config, args)
    (topics / f"{lane}.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    source = {
        "scheme": "meta",
        "secrets": ["env:METASTABLE_SECRET"],
        "key": {"pointer": "/key"},
        "event_id": {"pointer": "/id"},
        "topic": lane,
    }
    (directory / "sources.yaml").write_text(
        yaml.safe_dump({"sources": {"hooks": source}}), encoding="utf-8"
    )
    env = {
        **os.environ,
        "METASTABLE_SECRET": SECRET,
        "METASTABLE_LANE": lane,
        "METASTABLE_DONE": f"{config}:done",
        "METASTABLE_SERVICE_MS": str(args.service_ms),
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": redis_url,
        "PIPELINE_TOPICS_DIR": str(topics),
        "PIPELINE_RUNTIME__MAX_CONCURRENCY": str(args.concurrency),
        "PIPELINE_INGRESS__SOURCES_FILE": str(directory / "sources.yaml"),
        "PIPELINE_INGRESS__SQLITE_PATH": str(directory / "ingress.db"),
        "PIPELINE_INGRESS__SQLITE_SYNCHRONOUS": "NORMAL",
        "PIPELINE_INGRESS__SWEEPER__ENABLED": "false",
        "PIPELINE_LOG_LEVEL": "ERROR",
    }
    log = (directory / "processes.log").open("ab")
    redis_server = await asyncio.create_subprocess_exec(
        *("redis-server", "--port", str(redis_port), "--bind", "127.0.0.1"),
        *("--save", "", "--appendonly", "no"),
        stdout=asyncio.subprocess.DEVNULL,
    )
    procs = [redis_server]
    try:
        await wait_port(redis_port, redis_server, "redis-server")
        settings = load_settings(transport="redis", redis={"url": redis_url})
        transport = create_transport(settings)
        await apply(transport.admin(), [TopicSpec.model_validate(spec)], 1_000_000, dry_run=False)
        await transport.close()
        python = (sys.executable, "-m", "pipeline")
        group = f"g-{unique}"
        member = await asyncio.create_subprocess_exec(
            *python, "consume", "metastable_app:app", "--group", group,
            cwd=ROOT / "bench", env=env, stdout=log, stderr=log,
        )  # fmt: skip
        procs.append(member)
        ingress = await asyncio.create_subprocess_exec(
            *python, "ingress", "serve", "--port", str(ingress_port),
            env=env, stdout=log, stderr=log,
        )  # fmt: skip
        procs.append(ingress)
        await wait_port(ingress_port, ingress, "ingress")
        redis = Redis.from_url(redis_url)
        await drive(args, run, f"http://127.0.0.1:{ingress_port}", redis)
        raw = await redis.hgetall(f"{config}:done")
        run.done = {k.decode(): int(v) for k, v in raw.items()}
        await redis.aclose()
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
            await proc.wait()
        log.close()
    return run


def series(args: argparse.Namespace, run: Run) -> list[dict[str, Any]]:
    """Per second of the run: offered attempts, completions and goodput."""
    timeout_ms = int(args.timeout_s * 1000)
    seconds = args.warm_s + args.spike_s + args.after_s
    offered, completed, good = Counter[int](), Counter[int](), Counter[int]()
    for event_id, sent in run.sends.items():
        offered[(sent - run.started_ms) // 1000] += 1
        finished = run.done.get(event_id)
        if finished is None:
            continue
        second = (finished - run.started_ms) // 1000
        completed[second] += 1
        if finished - sent <= timeout_ms:
            good[second] += 1
    return [
        {
            "config": run.name,
            "second": s,
            "offered": offered[s],
            "completed": completed[s],
            "goodput": good[s],
        }
        for s in range(int(seconds))
    ]


def plot(args: argparse.Namespace, rows: list[dict[str, Any]], path: Path) -> bool:
    """Goodput and offered load per configuration as a PNG; False without matplotlib."""
    try:
        import matplotlib as mpl  # noqa: PLC0415 - optional

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - optional
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for config, color in (("naive", "tab:red"), ("shed", "tab:green")):
        mine = [r for r in rows if r["config"] == config]
        xs = [r["second"] for r in mine]
        ax.plot(xs, [r["goodput"] for r in mine], color=color, label=f"{config}: goodput")
        ax.plot(
            xs,
            [r["offered"] for r in mine],
            color=color,
            linestyle=":",
            label=f"{config}: offered attempts",
        )
    ax.axvspan(args.warm_s, args.warm_s + args.spike_s, color="0.9", label="spike")
    ax.axhline(
        args.concurrency * 1000 / args.service_ms,
        color="0.5",
        linestyle="--",
        label="lane capacity",
    )
    ax.set_xlabel("second")
    ax.set_ylabel("per second")
    ax.set_title("Retry storm after a spike: FIFO vs deadlines + shedding")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main() -> None:
    """Run both configurations and write the CSV, the plot and the JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--service-ms", type=int, default=50)
    parser.add_argument("--base", type=float, default=12)
    parser.add_argument("--spike", type=float, default=40)
    parser.add_argument("--warm-s", type=float, default=5)
    parser.add_argument("--spike-s", type=float, default=5)
    parser.add_argument("--after-s", type=float, default=20)
    parser.add_argument("--timeout-s", type=float, default=1.0)
    parser.add_argument("--attempts", type=int, default=4)
    parser.add_argument("--max-age-ms", type=int, default=500, help="shed: the lane's max_age")
    parser.add_argument("--sojourn-ms", type=int, default=100, help="shed: sojourn target")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"bench": "metastable"}
    for config in ("naive", "shed"):
        with tempfile.TemporaryDirectory() as tmp:
            run = asyncio.run(run_config(args, config, Path(tmp)))
        mine = series(args, run)
        rows += mine
        tail = [r["goodput"] for r in mine[-int(args.after_s // 2) :]]
        summary[f"{config}_recovered"] = round(sum(tail) / len(tail) / args.base, 2)
        summary[f"{config}_attempts"] = len(run.sends)
        answers = sorted(run.answered_ms.values()) or [0]
        summary[f"{config}_ingress_p50_ms"] = answers[len(answers) // 2]
        summary[f"{config}_ingress_p99_ms"] = answers[len(answers) * 99 // 100]
        summary[f"{config}_unanswered"] = len(run.sends) - len(run.answered_ms)
        print(f"{config}: {len(run.sends)} attempts, {len(run.done)} completed", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "metastable.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, ["config", "second", "offered", "completed", "goodput"])
        writer.writeheader()
        writer.writerows(rows)
    summary["png"] = plot(args, rows, args.out / "metastable.png")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
