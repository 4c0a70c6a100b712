"""Soak: mixed webhook load through the ingress and a member for a long time; resources stay flat.

Run: ``make soak`` (``SOAK_MINUTES``, default 30; not part of CI), or
``.venv/bin/python bench/soak.py --minutes 3``. Method and results: ``docs/benchmarks.md`` (Soak).

``pipeline ingress serve`` (a subprocess, durable SQLite log) takes signed webhooks of two
sources at a steady ``--rate`` per second in all (``bench/ingress.py``'s requests and open-loop
load, signed afresh for every 10-second slice): one source feeds a plain lane, the other a lane
with a 1 s retry tier whose handler fails 2 % of the events once (so retries, parking and their
Redis keys are exercised). One ``pipeline consume`` process serves both lanes as users run it
(``bench/soak_app.py`` in the run's directory; Redis under the run's key prefix, the function
channel, metrics on). Every 10 s the script samples, into a CSV: the RSS and open file
descriptors of the ingress and of the member (each with its children), the number of Redis keys
of the run (by its uuid tag) and of the whole Redis, webhooks accepted, and events handled. A
member or ingress that exits early ends the run with its log's last lines.

At the end it fits a least-squares line to each resource over the second half of the run (the
first half is warm-up: caches, pools and the SQLite log fill up) and prints the slope per
10 minutes. A resource is **flat** if its fitted growth over that half is at most ``--tolerance``
(default 10 %) of its mean there, or at most a small absolute floor (1 MiB of RSS, 2
descriptors, 20 keys); a fall is not growth. The last line is one JSON object; the exit status
is 1 if anything grew or the member did not stop within 20 s of SIGTERM (its exit code is
``member_exit_code``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import common
import psutil
from ingress import free_port, load, requests, start_ingress, stop
from lane_process import PIPELINE_CLI, log_tail, stop_process
from redis.asyncio import Redis

from pipeline.config import load_settings
from pipeline.errors import GroupNotEmpty, PipelineError
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport

SAMPLE_S = 10.0
FAIL_MODULO = 50  # crc32(event id) % 50 == 0: 2 % of the retry lane's events fail once
FLOOR = {"rss_mb": 1.0, "fds": 2.0, "keys": 20.0}
COLUMNS = [
    "t_s",
    "ingress_rss_mb",
    "ingress_fds",
    "member_rss_mb",
    "member_fds",
    "redis_keys_run",
    "redis_keys_total",
    "accepted",
    "handled",
]


def spec_docs(tag: str) -> list[dict[str, Any]]:
    """The two lanes of the run as topics/*.yaml has them: plain, and with a retry tier."""
    return [
        {"name": f"soak_{tag}_plain", "partitions": 4, "lane": "plain"},
        {"name": f"soak_{tag}_retry", "partitions": 4, "lane": "retry", "retry": {"tiers": ["1s"]}},
    ]


def specs(tag: str) -> list[TopicSpec]:
    """The two lanes of the run."""
    return [TopicSpec.model_validate(doc) for doc in spec_docs(tag)]


def write_config(workdir: Path, tag: str) -> None:
    """topics/*.yaml and sources.yaml for the ingress: source ``plain`` and ``retry``."""
    sources = {spec.lane: common.meta_source(spec.name) for spec in specs(tag)}
    common.write_config(workdir, spec_docs(tag), sources)


# -- the member process -------------------------------------------------------------------------

APP_FILE = Path(__file__).resolve().parent / "soak_app.py"


class SoakError(Exception):
    """A process of the run exited before the run's end."""


def start_member(
    workdir: Path, tag: str, transport: str, handled_path: Path
) -> subprocess.Popen[bytes]:
    """``pipeline consume soak_app:app`` in ``workdir``, with a metrics port of its own."""
    (workdir / "soak_app.py").write_bytes(APP_FILE.read_bytes())
    env = {
        **os.environ,
        "PIPELINE_TRANSPORT": transport,
        "PIPELINE_RUNTIME__METRICS_PORT": str(free_port()),
        "SOAK_HANDLED": str(handled_path),
        "SOAK_FAIL_MODULO": str(FAIL_MODULO),
    }
    with (workdir / "member.log").open("wb") as log:
        return subprocess.Popen(
            [str(PIPELINE_CLI), "consume", "soak_app:app", "--group", f"soak_{tag}_g"],
            cwd=workdir,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )


def check_running(label: str, proc: subprocess.Popen[bytes], log: Path | None = None) -> None:
    """Raise :class:`SoakError` (with ``log``'s last lines) if ``proc`` has exited."""
    if proc.poll() is None:
        return
    tail = log_tail(log, 5) if log is not None else ""
    raise SoakError(f"{label} exited with {proc.returncode} during the run{tail}")


# -- sampling and the verdict -------------------------------------------------------------------


def proc_sample(proc: subprocess.Popen[bytes]) -> tuple[float, int]:
    """(RSS in MiB, open file descriptors) of a process and its children."""
    rss, fds = 0.0, 0
    root = psutil.Process(proc.pid)
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            rss += p.memory_info().rss / 2**20
            fds += p.num_fds()
    return rss, fds


def key_shapes(keys: list[bytes]) -> dict[str, int]:
    """How many keys have each shape (message keys, digits and hex runs elided), most first."""
    shapes: dict[str, int] = {}
    for key in keys:
        text = re.sub(r"(:guard:[^}]+}:[zhf]:).+", r"\1KEY", key.decode(errors="replace"))
        shape = re.sub(r"[0-9a-f]{6,}|\d+", "#", text)
        shapes[shape] = shapes.get(shape, 0) + 1
    return dict(sorted(shapes.items(), key=lambda kv: -kv[1])[:12])


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def verdict(rows: list[dict[str, float]], tolerance: float) -> dict[str, Any]:
    """Slope per 10 minutes over the second half, and whether each resource stayed flat.

    Each resource's highest sample of the whole run (``peak``) is reported beside, never
    judged: memory that garbage holds until a rare collection frees it climbs and falls back,
    and a second half after the fall looks flat although the process once held much more.
    """
    half = rows[len(rows) // 2 :]
    out: dict[str, Any] = {}
    xs = [r["t_s"] for r in half]
    span_s = xs[-1] - xs[0] if len(xs) > 1 else 0.0
    for column in COLUMNS[1:7]:
        ys = [r[column] for r in half]
        per_s = slope(xs, ys)
        kind = "rss_mb" if "rss" in column else "fds" if "fds" in column else "keys"
        growth = per_s * span_s
        # Growth is what a leak looks like; a resource that falls (transient clients closed,
        # a cache trimmed) is not one.
        flat = growth <= max(FLOOR[kind], tolerance * statistics.fmean(ys))
        if column == "redis_keys_total":
            flat = True  # the whole shared Redis: reported, never judged (others use it too)
        out[column] = {
            "slope_per_10min": round(per_s * 600, 3),
            "flat": flat,
            "peak": max(r[column] for r in rows),
        }
    return out


async def clean_up(transport: Transport, redis: Redis, tag: str) -> None:
    """Delete the run's consumer group, topics and Redis keys (naming the keys' shapes)."""
    names = [name for spec in specs(tag) for name in spec.topic_names()]
    admin = transport.admin()  # a Kafka transport builds a new client at every call
    # The member held its slot on SIGTERM (the default): the group empties when its session,
    # 10 s by default, runs out.
    deadline = time.monotonic() + 30
    while True:
        try:
            await admin.delete_group(f"soak_{tag}_g", names)
        except GroupNotEmpty:
            if time.monotonic() < deadline:
                await asyncio.sleep(1)
                continue
            print("  the run's consumer group still had a member after 30 s", file=sys.stderr)
        except PipelineError as exc:
            print(f"  the run's consumer group was not deleted: {exc}", file=sys.stderr)
        break
    with contextlib.suppress(Exception):
        for name in names:
            await admin.delete_topic(name)
    keys = [k async for k in redis.scan_iter(match=f"*{tag}*", count=1000)]
    print(f"  run keys at the end, by shape: {key_shapes(keys)}", file=sys.stderr)
    for j in range(0, len(keys), 500):
        await redis.delete(*keys[j : j + 500])


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    """Run the load, sample every 10 s, and judge."""
    tag = uuid.uuid4().hex[:10]
    # Every Redis key of the run (streams, the guard's, the throttle's) carries its tag: this
    # process, the ingress and the member inherit the prefix.
    os.environ["PIPELINE_REDIS__KEY_PREFIX"] = f"soak-{tag}"
    settings = load_settings()
    transport = create_transport(settings, args.transport)
    redis = Redis.from_url(settings.redis.url)
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        workdir = Path(tmp)
        write_config(workdir, tag)
        await apply(transport.admin(), specs(tag), 200_000, dry_run=False)
        handled_path = workdir / "handled"
        member_proc = start_member(workdir, tag, args.transport, handled_path)
        ingress_proc: subprocess.Popen[bytes] | None = None
        accepted = 0
        member_exit: int | None = None
        t0 = time.monotonic()
        try:
            ingress_proc, port = start_ingress(workdir, "FULL", transport=args.transport)
            with Path(args.csv).open("w", newline="", encoding="utf-8") as fh:  # noqa: ASYNC230 - a small local CSV
                writer = csv.DictWriter(fh, fieldnames=COLUMNS)
                writer.writeheader()
                for i in range(int(args.minutes * 60 / SAMPLE_S)):
                    check_running("pipeline consume", member_proc, workdir / "member.log")
                    check_running("pipeline ingress serve", ingress_proc)  # its stderr is ours
                    per_source = int(args.rate * SAMPLE_S / 2)
                    loads = [
                        load(
                            port,
                            requests(per_source, f"{tag}s{i}", f"/hooks/{s.lane}"),
                            args.rate / 2,
                        )
                        for s in specs(tag)
                    ]
                    for ok, _, _ in await asyncio.gather(*loads):
                        accepted += ok
                    row = await sample(
                        ingress_proc, member_proc, redis, tag, t0, accepted, handled_path
                    )
                    rows.append(row)
                    writer.writerow(row)
                    fh.flush()
                    print(
                        "  " + ", ".join(f"{k} {v:g}" for k, v in row.items()),
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            if ingress_proc is not None:
                stop(ingress_proc)
            await asyncio.to_thread(stop_process, member_proc)
            member_exit = member_proc.returncode
            if member_exit != 0:  # -9: it did not stop within the grace after SIGTERM
                tail = log_tail(workdir / "member.log", 8)
                print(f"  pipeline consume's stop ended with {member_exit}{tail}", file=sys.stderr)
            await clean_up(transport, redis, tag)
            await transport.close()
            await redis.aclose()
    result = verdict(rows, args.tolerance) if len(rows) >= 4 else {}
    return {
        "bench": "soak",
        "minutes": args.minutes,
        "rate": args.rate,
        "transport": args.transport,
        "accepted": accepted,
        "handled": rows[-1]["handled"] if rows else 0,
        "flat": all(v["flat"] for v in result.values()) if result else None,
        "member_exit_code": member_exit,
        "slopes": result,
        "csv": args.csv,
    }


async def sample(
    ingress_proc: subprocess.Popen[bytes],
    member_proc: subprocess.Popen[bytes],
    redis: Redis,
    tag: str,
    t0: float,
    accepted: int,
    handled_path: Path,
) -> dict[str, float]:
    """One CSV row."""
    ingress_rss, ingress_fds = proc_sample(ingress_proc)
    member_rss, member_fds = proc_sample(member_proc)
    run_keys = sum([1 async for _ in redis.scan_iter(match=f"*{tag}*", count=1000)])
    return {
        "t_s": round(time.monotonic() - t0, 1),
        "ingress_rss_mb": round(ingress_rss, 1),
        "ingress_fds": ingress_fds,
        "member_rss_mb": round(member_rss, 1),
        "member_fds": member_fds,
        "redis_keys_run": run_keys,
        "redis_keys_total": int(await redis.dbsize()),
        "accepted": accepted,
        "handled": os.stat(handled_path).st_size if os.path.exists(handled_path) else 0,  # noqa: ASYNC240, PTH110, PTH116 - a local file's size
    }


def main() -> int:
    """Parse the arguments, soak, print the verdict."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument(
        "--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES") or "30")
    )
    parser.add_argument("--rate", type=float, default=200.0, help="webhooks per second, in all")
    parser.add_argument("--transport", choices=["redis", "kafka"], default="redis")
    parser.add_argument(
        "--csv",
        default=str(Path(tempfile.gettempdir()) / "pipeline-soak.csv"),
        help="where the samples go",
    )
    parser.add_argument("--tolerance", type=float, default=0.10, help="allowed relative growth")
    args = parser.parse_args()
    try:
        out = asyncio.run(soak(args))
    except SoakError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 1
    for column, v in out["slopes"].items():
        state = "flat" if v["flat"] else "GROWING"
        slope, peak = v["slope_per_10min"], v["peak"]
        print(f"{column:>18}: {slope:+.3f} per 10 min  {state}  (peak {peak:g})")
    print(json.dumps(out))
    return 0 if out["flat"] and out["member_exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
