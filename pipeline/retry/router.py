"""Route a failed message to its next retry tier or to the dead-letter topic.

A retry keeps the message's key and value and adds headers: the next attempt number, the due
time, the origin (topic, partition, offset and production time of the first delivery) and the
error. A dead letter
carries the same plus the reason (``fatal``, ``exhausted``, ``expired``, ``poison``) and first and
last failure times, so a redrive can put it back where it came from.

The due time and the failure times are read off the router's clock: in a member with Redis,
Redis's clock (:class:`~pipeline.runtime.shared_clock.SharedClock`), the one every member judges
due times by, so a copy waits its tier's delay whatever the failing host's clock says.

**Size.** Every header the router writes has a bounded size (free text is cut: the error's
message to :data:`MAX_ERROR_BYTES`, its class to :data:`MAX_ERROR_CLASS_BYTES`, the reason to
:data:`MAX_REASON_BYTES`), so a copy is at most :data:`ROUTED_HEADERS_BYTES` larger than the
message it copies, within :data:`~pipeline.transport.limits.COPY_HEADROOM_BYTES`: the headroom
the retry tiers and dead-letter topics have over the main topic, and the pipeline's own size
check over ``PIPELINE_MAX_MESSAGE_BYTES`` for copies (their headers are
:class:`~pipeline.transport.limits.CopyHeaders`). A dead letter its topic still refuses as too
large (a topic made by hand with a smaller ``max.message.bytes``) is replaced by a marker
(:func:`marker`) with one error line, so its message never holds its partition: the message
itself stays in the topic it was read from until that topic's retention.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline import headers as h
from pipeline import tracing
from pipeline.envelope import Delivered, Message
from pipeline.errors import DeadLetter, MessageTooLarge
from pipeline.log_repeats import error_text
from pipeline.retry.policy import Backoff
from pipeline.tracing import TRACEPARENT
from pipeline.transport.limits import COPY_HEADROOM_BYTES, CopyHeaders
from pipeline.transport.protocol import Producer

log = logging.getLogger(__name__)

MAX_ERROR_BYTES = 500
"""The longest ``pl-error-message`` (UTF-8, cut at a character's boundary)."""
MAX_ERROR_CLASS_BYTES = 200
"""The longest ``pl-error-class`` (module and qualified name of the error's class)."""
MAX_REASON_BYTES = 64
"""The longest ``pl-dead-reason``."""
_NUMBER_BYTES = 20
"""The longest decimal number a header holds (a signed 64-bit one)."""
_TOPIC_BYTES = 249
"""The longest topic name (Kafka's limit; a declared one is shorter)."""
_HEADER_FRAMING = 10
"""The most a header's framing takes in a Kafka record batch (its name's and value's lengths)."""
_MARKER_KEY_BYTES = 1_024
"""A dead letter's key kept on its marker up to this size (a longer one is named by its hash)."""

_WRITTEN = {
    h.ORIGIN_TOPIC: _TOPIC_BYTES,
    h.ORIGIN_PARTITION: _NUMBER_BYTES,
    h.ORIGIN_OFFSET: _NUMBER_BYTES,
    h.PRODUCED_AT_MS: _NUMBER_BYTES,
    h.SLA_FROM_MS: _NUMBER_BYTES,
    h.FIRST_FAILURE_MS: _NUMBER_BYTES,
    h.LAST_FAILURE_MS: _NUMBER_BYTES,
    h.ERROR_CLASS: MAX_ERROR_CLASS_BYTES,
    h.ERROR_MESSAGE: MAX_ERROR_BYTES,
    h.ERROR_DIGEST: 12,
    h.ATTEMPT: _NUMBER_BYTES,
    h.DUE_MS: _NUMBER_BYTES,
    h.DEAD_REASON: MAX_REASON_BYTES,
    TRACEPARENT: 55,
}
"""Every header the router writes on a copy, with the most bytes its value takes."""
ROUTED_HEADERS_BYTES = sum(len(name) + most + _HEADER_FRAMING for name, most in _WRITTEN.items())
"""The most a copy grows over the message it copies: every header of :data:`_WRITTEN` at its
longest, with its framing (one it replaces only frees the old value's bytes)."""


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


_CARRIED_DIGEST = "_pipeline_error_digest"
"""The attribute :func:`carry_digest` sets: the digest of frames the error object lacks."""


def error_digest(error: BaseException) -> str:
    """A short stable hash of where ``error`` was raised (file, function of each frame).

    That of :func:`frames_digest`, unless ``error`` carries a digest (:func:`carry_digest`):
    a CPU lane's exception is raised in the member again, with the member's frames only, so its
    worker hashes its own and the pool puts that digest on the copy it raises. Read from the
    exception object alone, never from a message's headers (any producer writes those).
    """
    try:
        carried = error.__dict__.get(_CARRIED_DIGEST)
    except Exception:  # an app's exception may refuse the look-up: the digest of its frames
        carried = None
    return carried if isinstance(carried, str) else frames_digest(error)


def frames_digest(error: BaseException) -> str:
    """The hash of ``error``'s class and the file and function of each frame of its traceback.

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


def carry_digest(error: BaseException, digest: str) -> None:
    """Have :func:`error_digest` give ``digest`` for ``error``: that of where it was raised.

    For a copy of an exception raised elsewhere (a CPU worker's, which pickle brings back
    without its traceback), ``digest`` being :func:`frames_digest` of the original there. An
    object refusing the attribute keeps the digest of its own frames.
    """
    with contextlib.suppress(Exception):
        error.__dict__[_CARRIED_DIGEST] = digest


def _with_origin(message: Message) -> CopyHeaders:
    """The message's headers plus where and when it was first delivered (kept if already there).

    Origin headers of a message read from a main topic, or that name no position of the
    message's lane (any producer can write them, :func:`~pipeline.headers.origin`), are replaced
    with where it was read, the id its guard gave it. The copy is a new record with a time of its
    own; ``pl-produced-at-ms`` keeps the first delivery's, so a cancellation covers the copy as it
    covered the message it came from. ``pl-sla-from-ms`` keeps when its SLA clock started
    (:func:`~pipeline.headers.sla_from_ms`): a message read from a main topic is no copy and
    starts it, whatever a redrive left of its dead letter's or another producer wrote.
    """
    out = CopyHeaders(message.headers)
    if h.origin(message.topic, message.headers) is None:  # a first delivery, or read as one
        out[h.ORIGIN_TOPIC] = message.topic.encode()
        out[h.ORIGIN_PARTITION] = str(message.partition).encode()
        out[h.ORIGIN_OFFSET] = str(message.offset).encode()
    if message.timestamp_ms > 0:
        out.setdefault(h.PRODUCED_AT_MS, str(message.timestamp_ms).encode())
    sla_from = h.sla_from_ms(message.headers, message.timestamp_ms, topic=message.topic)
    if sla_from > 0:
        out[h.SLA_FROM_MS] = str(sla_from).encode()
    else:
        out.pop(h.SLA_FROM_MS, None)
    return out


def _failure_headers(message: Message, error: BaseException | None, now_ms: int) -> CopyHeaders:
    out = _with_origin(message)
    out.setdefault(h.FIRST_FAILURE_MS, str(now_ms).encode())
    out[h.LAST_FAILURE_MS] = str(now_ms).encode()
    if error is not None:
        kind = f"{type(error).__module__}.{type(error).__qualname__}"
        out[h.ERROR_CLASS] = _cut(kind, MAX_ERROR_CLASS_BYTES)
        out[h.ERROR_MESSAGE] = _cut(error_text(error), MAX_ERROR_BYTES)  # a broken __str__ too
        out[h.ERROR_DIGEST] = error_digest(error).encode()
    return out


def _cut(text: str, most: int) -> bytes:
    """``text`` in UTF-8, at most ``most`` bytes of it (no character cut in two)."""
    raw = text[:most].encode(errors="replace")  # a lone surrogate becomes "?"
    return raw[:most].decode(errors="ignore").encode()


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
            return await self.dead_letter(routes, message, "exhausted", error, attempt=attempt)
        last = len(routes.retry_topics)
        tier = (last if longest else min(attempt, last)) - 1
        now_ms = self._clock_ms()
        out = _failure_headers(message, error, now_ms)
        out[h.ATTEMPT] = str(attempt + 1).encode()
        out[h.DUE_MS] = str(now_ms + routes.backoff.compute_ms(tier)).encode()
        topic = routes.retry_topics[tier]
        with tracing.sending(topic, out, "retry"):
            return await self._send_copy(topic, message, out)

    async def divert(self, routes: LaneRoutes, message: Message) -> Delivered:
        """Send a message of a parked key behind its head, through the first retry tier.

        Not a failure: the attempt count stays (1 for a message read from a main topic, whatever
        ``pl-attempt`` it carried), and the message is due after the first tier's delay, when
        it checks again whether it is the key's head.
        """
        now_ms = self._clock_ms()
        out = _with_origin(message)
        out[h.ATTEMPT] = str(h.attempt(message.topic, message.headers)).encode()
        out[h.DUE_MS] = str(now_ms + routes.backoff.compute_ms(0)).encode()
        topic = routes.retry_topics[0]
        with tracing.sending(topic, out, "divert"):
            return await self._send_copy(topic, message, out)

    async def dead_letter(
        self,
        routes: LaneRoutes,
        message: Message,
        reason: str,
        error: BaseException | None,
        *,
        attempt: int | None = None,
    ) -> Delivered:
        """Send to the lane's dead-letter topic with the reason and the error.

        Its ``pl-attempt`` is ``attempt``, the attempt the member counted (the member's
        :class:`~pipeline.runtime.redirect.Redirector` always gives it: on a main topic a
        producer's ``pl-attempt`` is no count, :func:`~pipeline.headers.attempt`); None: the
        message's own (:func:`~pipeline.headers.attempt_header`), never a producer's malformed
        one. Refused as too large, a marker (:func:`marker`) goes in its place, with one error
        line.
        """
        if error is None:  # every dead letter says what ended it, for redrive's filters
            error = DeadLetter(reason)
        if attempt is None:
            attempt = h.attempt_header(message.headers)
        out = _failure_headers(message, error, self._clock_ms())
        out[h.DEAD_REASON] = _cut(reason, MAX_REASON_BYTES)
        out[h.ATTEMPT] = str(max(1, attempt)).encode()
        out.pop(h.DUE_MS, None)
        topic = routes.dead_letter_topic
        with tracing.sending(topic, out, "dead_letter", reason):
            try:
                return await self._producer.send(topic, message.value, key=message.key, headers=out)
            except MessageTooLarge as exc:
                copy = marker(message, out, topic, exc)
                delivered = await self._producer.send(
                    topic, copy.value, key=copy.key, headers=copy.headers
                )
                log.error(  # noqa: TRY400 - the refusal is the whole story
                    "%s[%d]@%d: its dead letter (%d bytes) was refused by %s as too large"
                    " (%s); a marker naming it went in its place (%s[%d]@%d), the message"
                    " itself stays in %s until its retention: raise %s's max.message.bytes to"
                    " PIPELINE_MAX_MESSAGE_BYTES + %d (`pipeline topics apply` does)",
                    message.topic,
                    message.partition,
                    message.offset,
                    message_size(message, out),
                    topic,
                    exc,
                    delivered.topic,
                    delivered.partition,
                    delivered.offset,
                    message.topic,
                    topic,
                    COPY_HEADROOM_BYTES,
                )
                return delivered

    async def _send_copy(self, topic: str, message: Message, out: CopyHeaders) -> Delivered:
        """Produce ``message``'s copy to a retry tier; a refusal as too large says what to do.

        A retry copy is not replaced by a marker: its key may be parked behind it, waiting for
        it to come back from the tier.
        """
        try:
            return await self._producer.send(topic, message.value, key=message.key, headers=out)
        except MessageTooLarge as exc:
            raise MessageTooLarge(
                f"retry copy of {message.topic}[{message.partition}]@{message.offset} to"
                f" {topic}: {exc}; raise {topic}'s max.message.bytes to PIPELINE_MAX_MESSAGE_BYTES"
                f" + {COPY_HEADROOM_BYTES} (`pipeline topics apply` does)"
            ) from exc


def message_size(message: Message, headers: dict[str, bytes]) -> int:
    """Bytes of ``message``'s key and value with ``headers``, as a size check counts them."""
    extra = sum(len(k) + len(v) for k, v in headers.items())
    return len(message.value) + (len(message.key) if message.key else 0) + extra


@dataclass(frozen=True, slots=True)
class Marker:
    """What goes to a dead-letter topic in place of a dead letter it refused as too large."""

    value: bytes
    key: bytes | None
    headers: CopyHeaders


def marker(message: Message, out: CopyHeaders, topic: str, refusal: MessageTooLarge) -> Marker:
    """A small dead letter standing for ``message``, whose copy ``out`` ``topic`` refused.

    Its value is a JSON object naming the message (topic, partition, offset, its first
    delivery's), its size, the reason it was dead-lettered and the refusal; its headers are the
    router's only (reason ``too_large``, attempt, failure times and error). It has no
    ``pl-origin-topic``, so a redrive leaves it in the DLQ instead of sending the marker to the
    lane as if it were the message. The key is kept up to :data:`_MARKER_KEY_BYTES`, else
    named by its SHA-256 in the value.
    """
    key = message.key
    document = {
        "pipeline_marker": "dead letter too large",
        "topic": message.topic,
        "partition": message.partition,
        "offset": message.offset,
        "origin": {
            "topic": out[h.ORIGIN_TOPIC].decode(errors="replace"),
            "partition": out[h.ORIGIN_PARTITION].decode(errors="replace"),
            "offset": out[h.ORIGIN_OFFSET].decode(errors="replace"),
        },
        "bytes": message_size(message, out),
        "reason": out[h.DEAD_REASON].decode(errors="replace"),
        "refused_by": topic,
        "refusal": _cut(str(refusal), MAX_ERROR_BYTES).decode(),
    }
    if key is not None and len(key) > _MARKER_KEY_BYTES:
        document["key_sha256"] = hashlib.sha256(key).hexdigest()
        key = None
    kept = (
        h.ATTEMPT,
        h.PRODUCED_AT_MS,
        h.FIRST_FAILURE_MS,
        h.LAST_FAILURE_MS,
        h.ERROR_CLASS,
        h.ERROR_MESSAGE,
        h.ERROR_DIGEST,
        TRACEPARENT,
    )
    headers = CopyHeaders({name: out[name] for name in kept if name in out})
    headers[h.DEAD_REASON] = b"too_large"
    return Marker(json.dumps(document).encode(), key, headers)
