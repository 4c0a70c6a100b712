"""Names of the message headers the pipeline reads and writes, in one place.

Every header is raw bytes on the wire; numbers are ASCII decimal (times in milliseconds since the
epoch), so any tool (kcat, redis-cli) can read them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

ROW_ID = "pl-row-id"
"""The ingress log row this event came from (the runtime marks it processed)."""
SOURCE = "pl-source"
"""The webhook source (provider) the event came from."""
RECEIVED_AT_MS = "pl-received-at-ms"
"""When the ingress accepted the webhook."""
EVENT_ID = "pl-event-id"
"""The provider's event id (dedupe key of the ingress and of the idempotency guard)."""
TENANT = "pl-tenant"
"""The tenant (organisation) the event belongs to."""
DEADLINE_MS = "pl-deadline-ms"
"""After this time the event is worthless: it is dropped (counted) instead of processed late."""
ABANDON_AFTER_MS = "pl-abandon-after-ms"
"""After this time no one waits for the event's result: it is cancelled wherever it is, even
while its handler runs (:mod:`pipeline.cancel`)."""
ATTEMPT = "pl-attempt"
"""Processing attempt this delivery is (1 for the first, absent means 1)."""
DUE_MS = "pl-due-ms"
"""A retry-tier message is not processed before this time. Only the retry router writes it, on
retry-tier topics: on a message read from a main topic (any producer can write it there) it
means nothing (:func:`retry_tier`)."""
ORIGIN_TOPIC = "pl-origin-topic"
ORIGIN_PARTITION = "pl-origin-partition"
ORIGIN_OFFSET = "pl-origin-offset"
PRODUCED_AT_MS = "pl-produced-at-ms"
"""When the message a retry copy or dead letter came from was first produced (its broker time):
a cancellation by key or tenant covers the copy as it covered that message."""
SLA_FROM_MS = "pl-sla-from-ms"
"""When the SLA clock of a retry copy started (:func:`sla_from_ms`): the time of the delivery
the first copy was made of, kept through later tiers. It is the event's first production,
or its last redrive or replay: a redriven or replayed message is new work, and a copy of it does
not count from a production days before."""
ERROR_CLASS = "pl-error-class"
ERROR_MESSAGE = "pl-error-message"
ERROR_DIGEST = "pl-error-digest"
"""A short hash of the traceback's frames, to group failures with the same cause."""
FIRST_FAILURE_MS = "pl-first-failure-ms"
LAST_FAILURE_MS = "pl-last-failure-ms"
DEAD_REASON = "pl-dead-reason"
"""Why a message is in the dead-letter topic: fatal, exhausted, expired, poison."""
REDRIVE_COUNT = "pl-redrive-count"
REDRIVEN_FROM = "pl-redriven-from"
"""The dead letter a redriven message came from: ``<topic>:<partition>:<offset>``."""
REPLAY_COUNT = "pl-replay-count"
CONTENT_ENCODING = "pl-content-encoding"
"""The event's body is encoded so (``gzip``, ...): the request's ``Content-Encoding``, which the
ingress does not decode (it verifies, stores and produces the bytes sent)."""

_RETRY_INFIX = ".retry."
"""What separates a lane's main topic name from its tier's (``messages.retry.5s``)."""
_INT64 = re.compile(rb"-?[0-9]{1,19}")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_POSITION = re.compile(rb"[0-9]{1,19}")
"""A partition or offset as the router writes it: ASCII digits, at most an int64's."""


def parse_int(raw: bytes | None) -> int | None:
    """``raw`` as the pipeline writes numbers: ASCII decimal within a signed 64-bit integer.

    None for anything else: no value, text that is not such a number (blanks, ``1_000``,
    ``1e3``), or one beyond 64 bits, which as milliseconds or seconds overflows a float
    (``(now - due) / 1000``) and which Redis refuses as an integer argument.
    """
    if raw is None or not _INT64.fullmatch(raw):
        return None
    value = int(raw)
    return value if _INT64_MIN <= value <= _INT64_MAX else None


def int_header(headers: dict[str, bytes], name: str, default: int = 0) -> int:
    """An integer header (:func:`parse_int`), or ``default`` when absent or malformed."""
    value = parse_int(headers.get(name))
    return default if value is None else value


def attempt_header(headers: dict[str, bytes]) -> int:
    """The ``pl-attempt`` of a delivery: 1 when absent, malformed or below 1.

    A producer may write any value; a count below 1 would route a failure to no tier, or retry
    it without end. It counts only on a retry copy (:func:`attempt`).
    """
    return max(1, int_header(headers, ATTEMPT, 1))


def attempt(topic: str, headers: dict[str, bytes]) -> int:
    """The attempt a delivery read from ``topic`` with ``headers`` is: 1 on a main topic.

    Only the retry router writes ``pl-attempt``, on retry-tier copies; on a message read from a
    main topic (any producer can write it there, and a redrive removes it) it means nothing:
    trusted, a forged high count dead-letters the message at its first failure.
    """
    return attempt_header(headers) if retry_tier(topic) else 1


def retry_tier(topic: str) -> bool:
    """Whether ``topic`` is a lane's retry tier (``<main>.retry.<delay>``), not a main topic.

    A main topic's name holds no ``.retry.`` (:mod:`pipeline.topics.spec` refuses one), so the
    name alone tells. Only a message read from a tier is a retry copy whose ``pl-due-ms`` counts.
    """
    return _RETRY_INFIX in topic


def sla_from_ms(headers: dict[str, bytes], timestamp_ms: int, *, topic: str) -> int:
    """When the SLA clock of a delivery read from ``topic`` (``headers``, broker time) started.

    A message without ``pl-due-ms``, or read from a main topic, is no retry copy: new work
    (produced, redriven or replayed, or a copy's headers pasted onto a main topic), whose clock
    starts with it (``timestamp_ms``). A copy's starts at its ``pl-sla-from-ms``; a copy
    written before that header counts from ``pl-produced-at-ms`` unless it came from a redriven
    message (its ``pl-produced-at-ms`` is the dead letter's first production), which counts
    from its own time.
    A start after ``timestamp_ms`` (another producer's clock) is taken as ``timestamp_ms``.
    """
    if DUE_MS not in headers or not retry_tier(topic):
        return timestamp_ms
    start = int_header(headers, SLA_FROM_MS)
    if start <= 0 and SLA_FROM_MS not in headers and REDRIVE_COUNT not in headers:
        start = int_header(headers, PRODUCED_AT_MS)
    if start <= 0:
        return timestamp_ms
    return min(start, timestamp_ms) if timestamp_ms > 0 else start


def origin(topic: str, headers: Mapping[str, bytes]) -> str | None:
    """Where a copy read from ``topic`` was first delivered (``topic:partition:offset``), or None.

    None when ``headers`` hold no ``pl-origin-topic`` (a first delivery); when ``topic`` is a
    main topic: only the retry router writes the origin headers, on its copies to the retry tiers
    and dead-letter topic (a redrive removes them), so on a main topic another producer wrote
    them (or copied them with a dead letter it produced there again); and when they name no
    position of ``topic``'s lane: a topic other than its main topic or one of its retry tiers, or
    a partition or offset that is not a decimal number. Trusted, such headers give a message
    another one's id: taken for a duplicate of a message that ran, it is dropped unhandled; taken
    for a parked key's head, it runs as that head, releasing the key's followers ahead of the
    real copy, which is then dropped. A message with them is read as a first delivery.
    """
    raw = headers.get(ORIGIN_TOPIC)
    if raw is None or not retry_tier(topic):
        return None
    partition = headers.get(ORIGIN_PARTITION, b"")
    offset = headers.get(ORIGIN_OFFSET, b"")
    if not (_POSITION.fullmatch(partition) and _POSITION.fullmatch(offset)):
        return None
    try:
        name = raw.decode()
    except UnicodeDecodeError:
        return None
    if _main_topic(name) != _main_topic(topic):
        return None
    return f"{name}:{partition.decode()}:{offset.decode()}"


def origin_fault(topic: str, headers: Mapping[str, bytes]) -> str:
    """Why :func:`origin` took no origin from ``headers`` read from ``topic``, for a log line.

    It names the header at fault, never what it holds (any producer writes it: garbage that
    differs on every message would make every line a new one, which no backoff of repeated
    lines would hold back).
    """
    if ORIGIN_TOPIC not in headers:
        return f"no {ORIGIN_TOPIC}"
    if not retry_tier(topic):
        return f"it was read from the main topic {topic}, where only a retry tier's copy has them"
    for name in (ORIGIN_PARTITION, ORIGIN_OFFSET):
        if not _POSITION.fullmatch(headers.get(name, b"")):
            return f"its {name} is no decimal number within 64 bits"
    try:
        headers[ORIGIN_TOPIC].decode()
    except UnicodeDecodeError:
        return f"its {ORIGIN_TOPIC} is not UTF-8"
    return f"its {ORIGIN_TOPIC} is neither {_main_topic(topic)} nor one of its retry tiers"


def _main_topic(topic: str) -> str:
    """The main topic of ``topic``'s lane: ``topic`` itself, or the one its retry tier is of.

    A tier is ``<main>.retry.<delay>``: a main topic holds no ``.retry.`` but may end in
    ``.retry`` (``pay.retry.retry.5s`` is a tier of ``pay.retry``), and a delay holds no dot, so
    the tier's suffix starts at the last ``.retry.``.
    """
    return topic.rsplit(_RETRY_INFIX, 1)[0]
