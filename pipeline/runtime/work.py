"""What travels down a member's chain: a message together with the lane it belongs to.

Each stage of the chain (``runtime/chain.py``) reads only the fields of :class:`Item`, so a stage
works on bare :class:`~pipeline.envelope.Message` objects in its own tests and on :class:`Work`
in the member, where the lane, looked up once when the message enters, travels with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from pipeline.envelope import Message, TopicPartition

if TYPE_CHECKING:
    from pipeline.runtime.app import Lane
    from pipeline.runtime.flow import SentAway
    from pipeline.runtime.offsets import PartitionOffsets
    from pipeline.tracing import Delivery


class Item(Protocol):
    """What the stages read of what they carry."""

    @property
    def tp(self) -> TopicPartition:
        """The partition the message was read from."""
        ...

    @property
    def key(self) -> bytes | None:
        """The message's key."""
        ...

    @property
    def offset(self) -> int:
        """The message's offset in its partition."""
        ...

    @property
    def headers(self) -> dict[str, bytes]:
        """The message's headers."""
        ...

    @property
    def value(self) -> bytes:
        """The message's payload."""
        ...

    @property
    def timestamp_ms(self) -> int:
        """When the message was produced (ms since the epoch)."""
        ...


T = TypeVar("T", bound=Item)


@dataclass(slots=True)
class Work:
    """A message on its way through a member, with its lane (looked up once, on entry)."""

    message: Message
    lane: Lane
    entered_s: float = field(default_factory=time.perf_counter)
    trace: Delivery | None = None
    """Its ``process`` span while tracing is on (:mod:`pipeline.tracing`), else None."""
    offsets: PartitionOffsets | None = None
    """The offsets of its partition's assignment it was read under: its end counts there, not
    in a later assignment's, whose own copy of the same offset may not have run yet."""
    due: bool = False
    """It came from a retry tier and its delay is over: on an ordered lane, where its key's later
    messages wait behind it, the key lanes run it before the keys waiting for a worker."""
    sent_away: SentAway | None = None
    """Spilled from its full partition (:meth:`~pipeline.runtime.chain.Chain.spill`), the batch
    it went in: it no longer counts in the partition's buffer, only in that batch, until it is
    settled (:meth:`~pipeline.runtime.flow.FlowControl.removed`)."""

    @property
    def tp(self) -> TopicPartition:
        """The partition the message was read from."""
        return self.message.tp

    @property
    def key(self) -> bytes | None:
        """The message's key."""
        return self.message.key

    @property
    def offset(self) -> int:
        """The message's offset in its partition."""
        return self.message.offset

    @property
    def headers(self) -> dict[str, bytes]:
        """The message's headers."""
        return self.message.headers

    @property
    def value(self) -> bytes:
        """The message's payload."""
        return self.message.value

    @property
    def timestamp_ms(self) -> int:
        """When the message was produced (ms since the epoch)."""
        return self.message.timestamp_ms
