"""A reader made of a member of a group of its own, for the in-memory broker.

The in-memory broker lives in its process: there a :class:`~pipeline.transport.protocol.Reader`
is a consumer of a one-off group that never commits, deleted on close. (Redis Streams keeps a
group and its pending entries until deleted, so its reader uses no group:
``redis_streams/reader.py``; Kafka keeps a killed member's group until it expires, so its reader
assigns itself the partitions and joins no group: ``kafka/reader.py``.)
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Sequence

from pipeline.envelope import Message, TopicPartition
from pipeline.errors import PipelineError
from pipeline.transport.protocol import Admin, Consumer, StartAt

READER_GROUP_PREFIX = "pipeline-reader-"
"""The name of every group of a reader begins so (on Kafka: the ``group.id`` it never joins)."""


def reader_group() -> str:
    """A new group name for one reader."""
    return f"{READER_GROUP_PREFIX}{uuid.uuid4().hex[:8]}"


class GroupReader:
    """A :class:`~pipeline.transport.protocol.Reader` on a consumer of a group of its own."""

    def __init__(
        self,
        consumer: Callable[[str, StartAt], Consumer],
        admin: Callable[[], Admin],
        topics: Sequence[str],
        *,
        start_at: StartAt = "earliest",
    ) -> None:
        """Make the member with ``consumer(group, start_at)``; ``admin`` deletes its group."""
        self._group = reader_group()
        self._topics = list(topics)
        self._consumer = consumer(self._group, start_at)
        self._admin = admin

    async def poll(self, max_messages: int = 500, timeout_s: float = 1.0) -> list[Message]:
        """The member's next messages; nothing is ever committed."""
        return await self._consumer.poll(max_messages, timeout_s)

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make the next polls of ``tp`` start at ``offset``."""
        await self._consumer.seek(tp, offset)

    async def close(self) -> None:
        """Leave the group, then delete it (a broker that refuses leaves it to expire)."""
        await self._consumer.close()
        admin = self._admin()
        try:
            with contextlib.suppress(PipelineError):
                await admin.delete_group(self._group, self._topics)
        finally:
            await admin.close()
