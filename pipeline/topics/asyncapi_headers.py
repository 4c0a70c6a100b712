"""JSON schemas of the pipeline's message headers (:mod:`pipeline.headers`), for AsyncAPI."""

from __future__ import annotations

from typing import Any

from pipeline import headers as h
from pipeline.offload import reference


def _text(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _ms(description: str) -> dict[str, Any]:
    return {
        "type": "string",
        "pattern": "^[0-9]+$",
        "description": f"{description} (ms since epoch).",
    }


def _int(description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": "^[0-9]+$", "description": f"{description} (decimal)."}


_EVENT = {
    h.TENANT: _text("The tenant (organisation) the event belongs to."),
    h.EVENT_ID: _text("The provider's event id: the dedupe and idempotency key."),
    h.DEADLINE_MS: _ms("After this the event is worthless and expires instead of running"),
    h.SOURCE: _text("The webhook source (provider) the event came from."),
    h.RECEIVED_AT_MS: _ms("When the ingress accepted the webhook"),
    h.ROW_ID: _text("The ingress log row the event came from."),
    h.REDRIVE_COUNT: _int("How often the event was redriven from a dead-letter topic"),
    h.REPLAY_COUNT: _int(
        "0 on the first production; above 0, a replay of its log row (the sweeper's replays"
        " since the first production or the last replay by hand; by hand, the count before it"
        " plus one)"
    ),
    h.CONTENT_ENCODING: _text(
        "The request's Content-Encoding (gzip, ...): the body is as sent; decode it."
    ),
    h.REDRIVEN_FROM: _text("The dead letter it was redriven from: `<topic>:<partition>:<offset>`."),
    h.ABANDON_AFTER_MS: _ms(
        "After this no one waits for the result: the event is cancelled wherever it is"
    ),
    reference.OFFLOAD: _text(
        "Present when the payload travels by reference (the lane's `offload:`): the body is"
        " then a JSON reference to the object store, and this the reference's format (1)."
    ),
    reference.SIZE: _int("The offloaded payload's size in bytes"),
    reference.SHA256: _text("The offloaded payload's SHA-256, hex."),
    reference.CONTENT_TYPE: _text("The offloaded payload's content type (empty if unknown)."),
}
_RETRY = {
    h.ATTEMPT: _int("The processing attempt this delivery is; absent means 1"),
    h.DUE_MS: _ms("Not handled before this time"),
    h.ORIGIN_TOPIC: _text("The topic the event was first delivered from."),
    h.ORIGIN_PARTITION: _int("Its partition there"),
    h.ORIGIN_OFFSET: _int("Its offset there"),
    h.PRODUCED_AT_MS: _ms("When the event was first produced (its first delivery's time)"),
    h.SLA_FROM_MS: _ms(
        "When a batch lane's SLA clock started for the copy: the time of the delivery that"
        " first failed, the event's first production or its last redrive or replay"
    ),
    h.ERROR_CLASS: _text("The dotted class name of the last error."),
    h.ERROR_MESSAGE: _text("The last error's text, at most 500 characters."),
    h.ERROR_DIGEST: _text("A short hash of the traceback's frames, grouping failures by cause."),
    h.FIRST_FAILURE_MS: _ms("When the event first failed"),
    h.LAST_FAILURE_MS: _ms("When it last failed"),
}
_DEAD = {
    h.DEAD_REASON: _text(
        "Why the event is in the dead-letter topic: fatal, exhausted, expired, poison, "
        "sequenced (it followed its key's dead-lettered head), ..."
    ),
}


def _object(properties: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": f"{description} Values are bytes on the wire; numbers ASCII decimal.",
        "properties": properties,
    }


EVENT_HEADERS = _object(_EVENT, "Headers of an event as producers and the ingress set them.")
RETRY_HEADERS = _object({**_EVENT, **_RETRY}, "Headers of a retry: the event's, plus the failure.")
DEAD_LETTER_HEADERS = _object(
    {**_EVENT, **{k: v for k, v in _RETRY.items() if k != h.DUE_MS}, **_DEAD},
    "Headers of a dead letter: the event's, the failure and the reason.",
)
