"""Helpers for redrive tests: a declared lane with dead letters to move, and operators' windows."""

from __future__ import annotations

from runtime.helpers import declare, lane_spec

from pipeline import headers as h
from pipeline.redrive.select import Selection
from pipeline.topics.spec import TopicSpec
from pipeline.transport.partitioner import partition_for
from pipeline.transport.protocol import Transport

HOUR_S = 3_600


async def dead_letter_lane(
    transport: Transport, unique: str, partitions: int
) -> tuple[TopicSpec, str, dict[str, bytes]]:
    """Lane ``rd_{unique}`` declared, its dead-letter topic, and a fatal dead letter's headers."""
    spec = lane_spec(f"rd_{unique}", partitions)
    await declare(transport, spec)
    return spec, spec.dead_letter, {h.ORIGIN_TOPIC: spec.name.encode(), h.DEAD_REASON: b"fatal"}


def since_2h(now_s: float) -> Selection:
    """``--since 2h`` as typed by an operator whose clock reads ``now_s``."""
    return Selection.typed_as(since="2h", now_s=now_s)


def keys_for(partition: int, partitions: int, n: int) -> list[bytes]:
    """``n`` keys the transports place on ``partition`` of ``partitions``."""
    return [b"k%d" % i for i in range(2_000) if partition_for(b"k%d" % i, partitions) == partition][
        :n
    ]
