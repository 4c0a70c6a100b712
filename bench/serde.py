"""Serialize + deserialize throughput: our Avro serde against confluent-kafka's, same registry.

Method
------
One registry (ours, SQLite in a temporary directory) is served by uvicorn on a free loopback
port in this process. Both sides use the same schema (``schemas/message_received.avsc``) and
the same ``--records`` (default 20,000) distinct records as plain dicts (timestamps as
``datetime``), under the same subject.

* **ours**: :class:`pipeline.registry.client.serde.AvroSerializer` and ``AvroDeserializer`` on our
  :class:`~pipeline.registry.client.http.RegistryClient`.
* **confluent**: ``confluent_kafka.schema_registry.avro.AvroSerializer`` /
  ``AvroDeserializer`` on ``SchemaRegistryClient`` with a ``SerializationContext`` per topic.

Each side is warmed up first (registration, schema fetch and parse, caches), then timed runs are
interleaved ``ours, confluent, ours, confluent, ...`` (``--pairs``, default 5). One run
serializes every record and then deserializes every resulting message; the rate is records per
second for that full round (serialize + deserialize). Before timing, both sides are checked to
produce identical bytes and to read each other's output back equal to the input.

The headline ``vs_confluent`` is the median of the per-pair ratios ours/confluent (> 1: ours is
faster). The last line printed is one JSON object::

    {"bench": "serde", "vs_confluent": ..., ...}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer as ConfluentDeserializer
from confluent_kafka.schema_registry.avro import AvroSerializer as ConfluentSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from pipeline.registry.client.http import RegistryClient
from pipeline.registry.client.serde import AvroDeserializer, AvroSerializer
from pipeline.registry.server.api import create_app
from pipeline.registry.server.serve import BackgroundServer
from pipeline.registry.stores.sqlite.store import SqliteSchemaStore

SCHEMA = (Path(__file__).resolve().parents[1] / "schemas" / "message_received.avsc").read_text()
TOPIC = "bench-serde"
SUBJECT = f"{TOPIC}-value"


def records(n: int) -> list[dict[str, Any]]:
    """``n`` distinct MessageReceived records."""
    start = datetime(2025, 1, 1, tzinfo=UTC)
    return [
        {
            "event_id": f"evt-{i}",
            "tenant": f"tenant-{i % 50}",
            "source": "meta",
            "conversation_id": f"conv-{i % 1000}",
            "text": f"message number {i} " + "x" * (i % 120),
            "received_at": start + timedelta(milliseconds=i),
            "headers": {"x-request-id": f"r{i}"} if i % 2 else None,
        }
        for i in range(n)
    ]


Codec = tuple[Callable[[dict[str, Any]], bytes], Callable[[bytes], Any]]


def run_once(codec: Codec, batch: list[dict[str, Any]]) -> float:
    """Records per second for serializing then deserializing ``batch``."""
    serialize, deserialize = codec
    t0 = time.perf_counter()
    encoded = [serialize(r) for r in batch]
    for data in encoded:
        deserialize(data)
    return len(batch) / (time.perf_counter() - t0)


def main() -> int:
    """Run the benchmark; print a table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()

    batch = records(args.records)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteSchemaStore(str(Path(tmp) / "bench.db"))
        with BackgroundServer(create_app(store)) as server:
            ours_client = RegistryClient(server.url)
            sr = SchemaRegistryClient({"url": server.url})
            ctx = SerializationContext(TOPIC, MessageField.VALUE)
            ours_ser = AvroSerializer(ours_client, SCHEMA, SUBJECT)
            ours_de = AvroDeserializer(ours_client)
            their_ser = ConfluentSerializer(sr, SCHEMA)
            their_de = ConfluentDeserializer(sr)
            ours: Codec = (ours_ser.serialize, ours_de.deserialize)
            theirs: Codec = (lambda r: their_ser(r, ctx), lambda d: their_de(d, ctx))

            # Same bytes, and each reads the other's output back to the input.
            for record in batch[:200]:
                mine, their = ours[0](record), theirs[0](record)
                if mine != their or ours[1](their) != record or theirs[1](mine) != record:
                    print("serdes disagree on", record, file=sys.stderr)
                    return 1

            run_once(ours, batch[:2_000])
            run_once(theirs, batch[:2_000])
            pairs: list[tuple[float, float]] = []
            for i in range(args.pairs):
                a = run_once(ours, batch)
                b = run_once(theirs, batch)
                pairs.append((a, b))
                print(f"pair {i + 1}: ours {a:,.0f} rec/s  confluent {b:,.0f} rec/s  x{a / b:.2f}")
            ours_client.close()
            sr.close()
        store.close()

    ratios = [a / b for a, b in pairs]
    print(
        json.dumps(
            {
                "bench": "serde",
                "vs_confluent": round(statistics.median(ratios), 3),
                "ours_records_per_s": round(statistics.median(a for a, _ in pairs)),
                "confluent_records_per_s": round(statistics.median(b for _, b in pairs)),
                "ratios": [round(r, 3) for r in ratios],
                "records": args.records,
                "pairs": args.pairs,
                "schema": "message_received.avsc",
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
