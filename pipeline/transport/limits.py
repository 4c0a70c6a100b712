"""The limits every transport enforces before a message leaves the process."""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.envelope import Record
from pipeline.errors import MessageTooLarge, UnknownTopic


def check_sizes(records: Iterable[Record], max_message_bytes: int) -> None:
    """Raise :class:`MessageTooLarge` for the first record above ``max_message_bytes``."""
    for record in records:
        if record.size > max_message_bytes:
            raise MessageTooLarge(
                f"message of {record.size} bytes exceeds max_message_bytes={max_message_bytes}"
            )


def missing_partition(records: Iterable[Record], partitions: int) -> int | None:
    """The first partition a record names that is not one of ``0 .. partitions - 1``, if any."""
    for record in records:
        if record.partition is not None and not 0 <= record.partition < partitions:
            return record.partition
    return None


def check_partitions(topic: str, records: Iterable[Record], partitions: int) -> None:
    """Raise :class:`UnknownTopic` for the first record naming a partition ``topic`` lacks.

    Called before any record of a call is sent, so such a call sends nothing.
    """
    missing = missing_partition(records, partitions)
    if missing is not None:
        raise UnknownTopic(
            f"produce to {topic!r}: topic {topic!r} has no partition {missing} "
            f"(it has {partitions}: 0 to {partitions - 1}); name one of those, or none to "
            "place the message by its key"
        )
