"""Route a failed message to its next retry tier or to the dead-letter topic.

A retry keeps the message's key and value and adds headers: the next attempt number, the due
time, the origin (topic, partition, offset and production time of the first delivery) and the
error. A dead letter
carries the same plus the reason (``fatal``, ``exhausted``, ``expired``, ``poison``) and first and
last failure times, so a redrive can put it back where it came from.

The due time and the failure times are read off the router's clock: in a member with Redis,
Redis's clock (:class:`~pipeline.runtime.shared_clock.SharedClock`), the one every member judges
due times by, so a copy waits its tier's delay whatever the failing host's clock says.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline import headers as h
from pipeline import tracing
from pipeline.envelope import Delivered, Message
from pipeline.errors import DeadLetter
from pipeline.retry.policy import Backoff
from pipeline.transport.protocol import Producer

_MAX_ERROR_CHARS = 500


def _host_ms() -> int:
    """The host's clock in ms since the epoch (``time.time``, looked up at every call)."""
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class LaneRoutes:
    """Where a lane's failures go."""

    topic: str
    retry_topics: tuple[str, ...]
    dead_letter_topic: str
    max_attempts: int
    backoff: Backoff


def error_digest(error: BaseException) -> str:
    """A short stable hash of where ``error`` was raised (file, function of each frame).

    The frames are read from the traceback's code objects: ``traceback.extract_tb`` would also
    look up every frame's source line and column positions, which the digest does not use and
    which cost more than the rest of a failure's routing.
    """
    names = []
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        names.append(f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}")
        tb = tb.tb_next
    shape = "|".join(names)
    return hashlib.sha256(f"{type(error).__name__}|{shape}".encode()).hexdigest()[:12]


def _with_origin(message: Message) -> dict[str, bytes]:
    """The message's headers plus where and when it was first delivered (kept if already there).

    Origin headers that name no position of the message's lane (any producer can write them,
    :func:`~pipeline.headers.origin`) are replaced with where it was read, the id its guard
    gave it. The copy is a new record with a time of its own; ``pl-produced-at-ms`` keeps the first
    delivery's, so a cancellation covers the copy as it covered the message it came from.
    ``pl-sla-from-ms`` keeps when its SLA clock started (:func:`~pipeline.headers.sla_from_ms`):
    a message that is no copy starts it, whatever a redrive left of its dead letter's.
    """
    out = dict(message.headers)
    if h.origin(message.topic, message.headers) is None:  # a first delivery, or read as one
        out[h.ORIGIN_TOPIC] = message.topic.encode()
        out[h.ORIGIN_PARTITION] = str(message.partition).encode()
        out[h.ORIGIN_OFFSET] = str(message.offset).encode()
    if message.timestamp_ms > 0:
        out.setdefault(h.PRODUCED_AT_MS, str(message.timestamp_ms).encode())
    sla_from = h.sla_from_ms(message.headers, message.timestamp_ms)
    if sla_from > 0:
        out[h.SLA_FROM_MS] = str(sla_from).encode()
    else:
        out.pop(h.SLA_FROM_MS, None)
    return out


def _failure_headers(
    message: Message, error: BaseException | None, now_ms: int
) -> dict[str, bytes]:
    out = _with_origin(message)
    out.setdefault(h.FIRST_FAILURE_MS, str(now_ms).encode())
    out[h.LAST_FAILURE_MS] = str(now_ms).encode()
    if error is not None:
        out[h.ERROR_CLASS] = f"{type(error).__module__}.{type(error).__qualname__}".encode()
        out[h.ERROR_MESSAGE] = str(error)[:_MAX_ERROR_CHARS].encode(errors="replace")
        out[h.ERROR_DIGEST] = error_digest(error).encode()
    return out


class RetryRouter:
    """Produces failed messages to retry tiers and dead-letter topics."""

    def __init__(self, producer: Producer, clock_ms: Callable[[], int] = _host_ms) -> None:
        """Use ``producer`` for every routed message.

        ``clock_ms``: now in ms since the epoch, for due and failure times (the host's clock
        unless given; a member gives Redis's).
        """
        self._producer = producer
        self._clock_ms = clock_ms

    async def retry(
        self,
        routes: LaneRoutes,
        message: Message,
        attempt: int,
        error: BaseException,
        *,
        longest: bool = False,
    ) -> Delivered:
        """Send to the tier of ``attempt`` (1-based), or dead-letter it when none is left.

        ``longest`` sends it to the longest tier whatever the attempt (the retry budget is
        spent).
        """
        if attempt >= routes.max_attempts or not routes.retry_topics:
            return await self.dead_letter(routes, message, "exhausted", error)
        last = len(routes.retry_topics)
        tier = (last if longest else min(attempt, last)) - 1
        now_ms = self._clock_ms()
        out = _failure_headers(message, error, now_ms)
        out[h.ATTEMPT] = str(attempt + 1).encode()
        out[h.DUE_MS] = str(now_ms + routes.backoff.compute_ms(tier)).encode()
        topic = routes.retry_topics[tier]
        with tracing.sending(topic, out, "retry"):
            return await self._producer.send(topic, message.value, key=message.key, headers=out)

    async def divert(self, routes: LaneRoutes, message: Message) -> Delivered:
        """Send a message of a parked key behind its head, through the first retry tier.

        Not a failure: the attempt count stays, and the message is due after the first tier's
        delay, when it checks again whether it is the key's head.
        """
        now_ms = self._clock_ms()
        out = _with_origin(message)
        out[h.DUE_MS] = str(now_ms + routes.backoff.compute_ms(0)).encode()
        topic = routes.retry_topics[0]
        with tracing.sending(topic, out, "divert"):
            return await self._producer.send(topic, message.value, key=message.key, headers=out)

    async def dead_letter(
        self, routes: LaneRoutes, message: Message, reason: str, error: BaseException | None
    ) -> Delivered:
        """Send to the lane's dead-letter topic with the reason and the error."""
        if error is None:  # every dead letter says what ended it, for redrive's filters
            error = DeadLetter(reason)
        out = _failure_headers(message, error, self._clock_ms())
        out[h.DEAD_REASON] = reason.encode()
        out.setdefault(h.ATTEMPT, b"1")
        out.pop(h.DUE_MS, None)
        topic = routes.dead_letter_topic
        with tracing.sending(topic, out, "dead_letter", reason):
            return await self._producer.send(topic, message.value, key=message.key, headers=out)
