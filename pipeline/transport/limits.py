"""The limits every transport enforces before a message leaves the process."""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.envelope import Record
from pipeline.errors import MessageTooLarge, UnknownTopic

COPY_HEADROOM_BYTES = 4_096
"""What a retry or dead-letter copy may take beyond the message it copies.

The copy keeps the message's key, value and headers and adds the router's own, each of a bounded
size (:data:`pipeline.retry.router.ROUTED_HEADERS_BYTES`, with their Kafka framing). A lane's
retry tiers and dead-letter topic take this much more than ``PIPELINE_MAX_MESSAGE_BYTES``
(``pipeline topics apply`` sets their ``max.message.bytes``), and :func:`check_sizes` lets a copy
(:class:`CopyHeaders`) through with it, so a message its main topic took can always be routed."""


class CopyHeaders(dict[str, bytes]):
    """The headers of a retry or dead-letter copy the router made of a consumed message.

    :func:`check_sizes` allows a record carrying them :data:`COPY_HEADROOM_BYTES` beyond the
    limit. Only the router makes them, in this process: a header on the wire grants nothing.
    """

    __slots__ = ()


def check_sizes(records: Iterable[Record], max_message_bytes: int) -> None:
    """Raise :class:`MessageTooLarge` for the first record above ``max_message_bytes``.

    A copy (its headers are :class:`CopyHeaders`) may be :data:`COPY_HEADROOM_BYTES` larger.
    """
    for record in records:
        copy = isinstance(record.headers, CopyHeaders)
        limit = max_message_bytes + COPY_HEADROOM_BYTES if copy else max_message_bytes
        if record.size > limit:
            what = "copy" if copy else "message"
            raise MessageTooLarge(
                f"{what} of {record.size} bytes exceeds max_message_bytes={max_message_bytes}"
                + (f" plus the {COPY_HEADROOM_BYTES} bytes a copy may add" if copy else "")
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
