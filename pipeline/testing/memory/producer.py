"""The in-memory :class:`~pipeline.transport.protocol.Producer`."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence

from pipeline.envelope import Delivered, Record
from pipeline.errors import PipelineError
from pipeline.testing.memory.broker import Entry, MemoryBroker
from pipeline.transport.limits import check_partitions, check_sizes
from pipeline.transport.partitioner import partition_for


def _as_bytes(raw: bytes | str) -> bytes:
    """A header value as the real clients store it: text as UTF-8 (read back as bytes)."""
    return raw.encode() if isinstance(raw, str) else raw


class MemoryProducer:
    """Appends to a :class:`MemoryBroker`; a keyed message goes to its murmur2 partition."""

    def __init__(self, broker: MemoryBroker, max_message_bytes: int) -> None:
        """Produce to ``broker``, refusing messages above ``max_message_bytes``."""
        self._broker = broker
        self._max_message_bytes = max_message_bytes
        self.sent: list[tuple[str, Record, Delivered]] = []
        """Every message this producer sent, in order (for assertions in tests)."""

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Delivered:
        """Append one message; acknowledged at once."""
        (delivered,) = await self.send_many(topic, [Record(value, key, headers, partition)])
        return delivered

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        """Append a batch in order; on a failure the others still go, then the first error.

        A message above ``max_message_bytes`` or one naming a partition the topic lacks refuses
        the whole batch before any goes, as the real transports check both before sending.
        """
        check_sizes(records, self._max_message_bytes)
        self._broker.check(f"produce to {topic!r}")
        check_partitions(topic, records, len(self._broker.topic(topic).partitions))
        out: list[Delivered] = []
        first: PipelineError | None = None
        for record in records:
            try:
                out.append(self._append(topic, record))
            except PipelineError as exc:
                first = first or exc
        if first is not None:
            raise first
        return out

    def _append(self, topic: str, record: Record) -> Delivered:
        self._broker.check(f"produce to {topic!r}")
        partitions = len(self._broker.topic(topic).partitions)
        if record.partition is not None:
            chosen = record.partition
        elif record.key is None:
            chosen = random.randrange(partitions)
        else:
            chosen = partition_for(record.key, partitions)
        headers = {name: _as_bytes(raw) for name, raw in (record.headers or {}).items()}
        entry = Entry(record.key, record.value, headers, int(time.time() * 1000))
        offset = self._broker.append(topic, chosen, entry)
        delivered = Delivered(topic, chosen, offset)
        self.sent.append((topic, record, delivered))
        return delivered

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Nothing to wait for: every send is acknowledged when it returns."""

    async def close(self) -> None:
        """Nothing to release."""
