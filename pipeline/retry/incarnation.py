"""Which message a guard id names: the broker time of its first delivery (``pl-origin-ms``).

The guard names a message by where it was first delivered (``topic:partition:offset``,
:func:`~pipeline.retry.guard_store.message_id`) and remembers the ids that finished
(``T:gone``). A position is given out again when its topic is deleted and created anew, or
when the lane runs on the other transport under the same Redis key prefix, while the lane's
guard state stays: a new message there would be taken for a late copy of the finished one and
dropped. The broker time of the first delivery (Kafka's message timestamp, a Redis Streams
entry's produce time) tells the two apart: the guard keeps it beside each finished id, and the
router writes it on every copy it makes (:data:`~pipeline.headers.ORIGIN_MS`, with the other
origin headers).
"""

from __future__ import annotations

from pipeline import headers as h
from pipeline.envelope import Message


def born_ms(message: Message, origin: str | None) -> int | None:
    """The broker time of the first delivery of ``message``, or None if it is not known.

    ``origin`` is the message's origin as :func:`~pipeline.headers.origin` read it: None for a
    first delivery (its own timestamp), else a copy's (its ``pl-origin-ms``). A time of 0 or
    less (a producer that set none) is not known.
    """
    if origin is None:
        born = message.timestamp_ms
    else:
        born = h.parse_int(message.headers.get(h.ORIGIN_MS)) or 0
    return born if born > 0 else None


def born_of(message: Message) -> int | None:
    """:func:`born_ms` of ``message``, its origin read from its headers (a held follower's)."""
    return born_ms(message, h.origin(message.topic, message.headers))
