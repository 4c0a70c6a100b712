"""The size limit both transports enforce before a message leaves the process."""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.envelope import Record
from pipeline.errors import MessageTooLarge


def check_sizes(records: Iterable[Record], max_message_bytes: int) -> None:
    """Raise :class:`MessageTooLarge` for the first record above ``max_message_bytes``."""
    for record in records:
        if record.size > max_message_bytes:
            raise MessageTooLarge(
                f"message of {record.size} bytes exceeds max_message_bytes={max_message_bytes}"
            )
