"""A redrive of a Redis DLQ one of whose partitions' stream key another program overwrote.

A 4-partition DLQ whose partition 1 key holds a string: `pipeline redrive` and its `--dry-run`
exited 1 at once (the lag of the DLQ failed on the key) and moved, or counted, nothing. Now the
healthy partitions are redriven (dry: counted), one line names the partition, its key and
`redis-cli DEL`, and the exit status says what is left: a dry run exits 0 as always; a real one,
having moved and committed the healthy partitions' dead letters, exits 1 (an error: a DLQ
partition no dead letter can be written to or read from until the key is deleted). Once it is
deleted, the same command moves nothing twice.
"""

from __future__ import annotations

from pathlib import Path

from redis.asyncio import Redis
from runtime.helpers import declare, lane_spec
from support import cli_environment, delete_group_after, held_messages, run_pipeline

from pipeline import headers as h
from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.redrive.redrive import group_name
from pipeline.redrive.select import Selection
from pipeline.transport.protocol import Transport

PARTITIONS = 4
BAD = 1
PER_PARTITION = 3


async def test_the_healthy_partitions_are_redriven_and_the_bad_key_named(
    tmp_path: Path, streams: Transport, settings: Settings, redis: Redis, unique: str
) -> None:
    """Dry: 9 counted, exit 0. Real: 9 moved once, exit 1. Key deleted: nothing moved again."""
    spec = lane_spec(f"rdkey_{unique}", PARTITIONS)
    await declare(streams, spec)
    dlq = spec.dead_letter
    producer = streams.producer()
    try:
        for p in range(PARTITIONS):
            records = [
                Record(
                    b"d-%d-%d" % (p, i),
                    b"k",
                    {h.ORIGIN_TOPIC: spec.name.encode(), h.EVENT_ID: b"e-%d-%d" % (p, i)},
                    partition=p,
                )
                for i in range(PER_PARTITION)
            ]
            await producer.send_many(dlq, records)
    finally:
        await producer.close()
    stream = f"{{{settings.redis.key_prefix}:{dlq}:{BAD}}}:s"
    await redis.set(stream, b"not a stream")
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "lane.yaml").write_text(
        f"name: {spec.name}\npartitions: {PARTITIONS}\n", encoding="utf-8"
    )
    env = cli_environment(tmp_path, PIPELINE_TOPICS_DIR=str(topics), PIPELINE_TRANSPORT="redis")
    delete_group_after(streams, group_name(dlq, None, Selection.typed_as()), [dlq])

    dry = run_pipeline("redrive", dlq, "--dry-run", env=env)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "would move 9," in dry.stdout, dry.stdout
    _names_the_key(dry.stderr, dlq, stream)

    real = run_pipeline("redrive", dlq, env=env)
    assert real.returncode == 1, real.stdout + real.stderr
    _names_the_key(real.stderr, dlq, stream)
    assert "moved 9" in real.stderr.splitlines()[-1], real.stderr
    healthy = [b"e-%d-%d" % (p, i) for p in range(PARTITIONS) if p != BAD for i in range(3)]
    assert sorted(m.headers[h.EVENT_ID] for m in await held_messages(streams, spec.name)) == healthy

    await redis.delete(stream)  # as the line says
    again = run_pipeline("redrive", dlq, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "moved 0" in again.stdout, again.stdout
    assert sorted(m.headers[h.EVENT_ID] for m in await held_messages(streams, spec.name)) == healthy


def _names_the_key(stderr: str, dlq: str, stream: str) -> None:
    """The redrive's line names the partition, its key and what to do; no traceback."""
    lines = stderr.splitlines()
    assert not any("Traceback" in line for line in lines), stderr
    ours = [line for line in lines if f"{dlq}[{BAD}]" in line and stream in line]
    assert ours, lines
    assert all(f"`redis-cli DEL {stream}`" in line for line in ours), ours
