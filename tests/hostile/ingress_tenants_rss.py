"""By hand: an ingress's resident memory under webhooks of distinct tenants (not a test).

``.venv/bin/python tests/hostile/ingress_tenants_rss.py WEBHOOKS [ROUNDS]`` declares a topic of
its own on Kafka, starts ``pipeline ingress serve`` (SQLite log, sweeper on, metrics refreshed
each second) with a Meta source reading tenant, key and event id from the body, warms it up,
then sends ``ROUNDS`` floods (2 by default) of ``WEBHOOKS`` signed webhooks over 32 keep-alive
connections on loopback, every one with a tenant, key and event id no other had. It prints the
process's ``VmRSS`` and the size of ``/metrics`` after the warm-up, after each flood and after
each idle spell. The topic and the log are deleted at the end.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml
from confluent_kafka.admin import AdminClient

from pipeline.topics.admin import apply
from pipeline.topics.spec import load_specs
from pipeline.transport import create_transport

sys.path.insert(0, str(Path(__file__).parents[1]))  # run as a script: tests/ holds its helpers
from hostile.flood_webhooks import flood_source, send_in_turn, webhook
from hostile.measure import rss_kib, say
from ingress.helpers import listening_url, start_ingress, stop
from support import cli_environment, test_settings

CONNECTIONS = 32
WARM_UP = 2_000
IDLE_S = float(os.environ.get("FLOOD_IDLE_S", "20"))


def rss_parts(pid: int) -> str:
    """The resident set's parts: anonymous, file-backed, shared memory (KiB)."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return ", ".join(
        f"{name.removeprefix('Rss').lower()} {fields[name].split()[0]}"
        for name in ("RssAnon", "RssFile", "RssShmem")
    )


async def connection(port: int, numbers: range, statuses: dict[int, int]) -> None:
    """Send webhooks ``numbers`` one after the other over one keep-alive connection."""
    run = os.environ["FLOOD_RUN"]
    await send_in_turn(port, (webhook(run, n) for n in numbers), statuses)


async def send(port: int, first: int, count: int) -> dict[int, int]:
    """Webhooks ``first`` to ``first + count`` over :data:`CONNECTIONS` connections; statuses."""
    statuses: dict[int, int] = {}
    await asyncio.gather(
        *(
            connection(port, range(first + c, first + count, CONNECTIONS), statuses)
            for c in range(CONNECTIONS)
        )
    )
    return statuses


async def metrics_bytes(port: int) -> int:
    """The size of the ``/metrics`` exposition."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        data = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    return len(data.partition(b"\r\n\r\n")[2])


async def measure(port: int, pid: int, webhooks: int, rounds: int) -> None:
    """Warm up, then ``rounds`` floods of ``webhooks``; print VmRSS and /metrics sizes."""
    await send(port, 0, WARM_UP)
    await asyncio.sleep(IDLE_S)  # the dispatcher's marks, a sweep, a metrics refresh
    warm, warm_metrics = rss_kib(pid), await metrics_bytes(port)
    say(
        f"after a warm-up of {WARM_UP}: VmRSS {warm} KiB ({rss_parts(pid)}),"
        f" /metrics {warm_metrics} bytes"
    )
    for round_ in range(rounds):
        started = time.monotonic()
        statuses = await send(port, WARM_UP + round_ * webhooks, webhooks)
        took_s = time.monotonic() - started
        after = rss_kib(pid)
        await asyncio.sleep(IDLE_S)
        idle, size = rss_kib(pid), await metrics_bytes(port)
        say(
            f"flood {round_ + 1}: {webhooks} tenants in {took_s:.0f} s"
            f" ({webhooks / took_s:.0f}/s), answers {statuses}; VmRSS at its end {after} KiB,"
            f" idle {IDLE_S:.0f} s after {idle} KiB ({idle - warm:+d} KiB on the warm-up:"
            f" {rss_parts(pid)});"
            f" /metrics {size} bytes ({size - warm_metrics:+d})"
        )


def declaration(topic: str) -> dict[str, object]:
    """The declaration of the run's topic."""
    return {"name": topic, "partitions": 4, "lane": f"tenants_{os.environ['FLOOD_RUN']}"}


def write_files(directory: Path, topic: str) -> None:
    """The sources file: one Meta source, ``flood``, to ``topic``."""
    source = flood_source(topic)
    (directory / "sources.yaml").write_text(
        yaml.safe_dump({"sources": {"flood": source}}), encoding="utf-8"
    )


async def main(webhooks: int, rounds: int = 2) -> None:
    """Run the measurement and print its figures."""
    settings = test_settings()
    run = os.environ.setdefault("FLOOD_RUN", uuid.uuid4().hex[:10])
    topic = f"tenants-{run}"
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "topics").mkdir()
        (directory / "topics" / "t.yaml").write_text(yaml.safe_dump(declaration(topic)))
        transport = create_transport(settings, "kafka")
        specs = load_specs(directory / "topics")
        await apply(transport.admin(), specs, 100_000, dry_run=False)
        await transport.close()
        env = cli_environment(
            directory,
            PIPELINE_TRANSPORT="kafka",
            PIPELINE_KAFKA__BOOTSTRAP_SERVERS=settings.kafka.bootstrap_servers,
            PIPELINE_REDIS__URL=settings.redis.url,
            PIPELINE_TOPICS_DIR=str(directory / "topics"),
            PIPELINE_INGRESS__SOURCES_FILE=str(directory / "sources.yaml"),
            PIPELINE_INGRESS__METRICS_INTERVAL_S="1",
            PIPELINE_INGRESS__SWEEPER__INTERVAL_S="5",
            PIPELINE_LOG_LEVEL="WARNING",
        )
        write_files(directory, topic)  # after cli_environment, which writes a sources file too
        log = directory / "ingress.log"
        with log.open("w", encoding="utf-8") as stderr:
            proc = start_ingress(env, cwd=directory, stderr=stderr)
        try:
            url = await asyncio.to_thread(listening_url, proc, log)
            await measure(int(url.rsplit(":", 1)[1]), proc.pid, webhooks, rounds)
        finally:
            await asyncio.to_thread(stop, proc)
            admin = AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})
            names = [name for spec in specs for name in spec.topic_names()]
            for future in admin.delete_topics(names).values():
                future.result()
            say(f"its log: {log.read_text(encoding='utf-8')[-3000:]}")


if __name__ == "__main__":
    asyncio.run(main(*(int(a) for a in sys.argv[1:3])))
