"""Messages a consumer group lost to retention: removed by the broker before the group read them.

Kafka deletes a partition's oldest records by ``retention.ms`` / ``retention.bytes``; Redis
Streams trims a stream by length (``XADD MAXLEN ~``), whatever its groups have read. A group
behind either skips what went: Kafka's ``auto.offset.reset=earliest`` moves it to the first
record held, Redis's ``XREADGROUP`` reads on from the first entry held, and ``XAUTOCLAIM``
drops the pending entries that are gone. The member goes on (stopping would not bring them
back), but says so: :func:`report_lost` logs one ERROR line per partition and range and adds
them to a per-process tally, exported as ``pipeline_messages_lost_to_retention_total``.
"""

from __future__ import annotations

import logging
import threading

from pipeline.envelope import TopicPartition

__all__ = ["lost_to_retention", "report_lost"]

log = logging.getLogger(__name__)
_lock = threading.Lock()  # the Kafka member reports from its client's thread too
_lost: dict[tuple[str, str], int] = {}


def report_lost(group: str, tp: TopicPartition, first: int, end: int, *, transport: str) -> None:
    """Log and count the offsets ``first`` to ``end - 1`` of ``tp`` that ``group`` lost.

    Nothing is done for an empty range.
    """
    count = end - first
    if count <= 0:
        return
    with _lock:
        _lost[(tp.topic, group)] = _lost.get((tp.topic, group), 0) + count
    log.error(
        "group %r lost %d messages of %s[%d] to retention: offsets %d..%d were removed by %s "
        "before the group read them; webhooks among them are replayed from the ingress's log "
        "by its sweeper (rows never marked processed, while the log keeps them); raise the "
        "topic's %s or add members",
        group,
        count,
        tp.topic,
        tp.partition,
        first,
        end - 1,
        "Redis (MAXLEN ~ max_len)" if transport == "redis" else "Kafka (retention.ms/bytes)",
        "max_len (a length: Redis trims by it)" if transport == "redis" else "retention",
    )


def lost_to_retention() -> dict[tuple[str, str], int]:
    """Messages lost to retention in this process so far, by (topic, group)."""
    with _lock:
        return dict(_lost)
