"""One observation per handler call, appended to a bounded Redis stream the dashboard reads.

The example handlers in ``consumers/`` stay free of demo code: :func:`observe_app` wraps the
handlers of an :class:`~pipeline.runtime.App` so that each call appends, after it returns or
raises, one compact entry (tenant, lane, event id, received / started / finished times, outcome,
turn size, attempt) with ``XADD MAXLEN ~`` (https://redis.io/docs/latest/commands/xadd/). The
stream is bounded, so a dashboard that stops reading never grows Redis without limit. A failure to
record is logged and swallowed: observing never changes what happens to a message.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

from redis.asyncio import Redis
from redis.exceptions import RedisError

from demo import keys
from pipeline import headers as h
from pipeline.errors import Skip
from pipeline.retry.policy import Retryable
from pipeline.runtime import App, Context
from pipeline.runtime.app import Handler

log = logging.getLogger(__name__)

Outcome = Literal["ok", "retry", "dead", "skip"]
"""What the handler call ended with: returned, will be retried, dead-lettered, skipped."""
_OUTCOMES: frozenset[str] = frozenset(get_args(Outcome))
MAX_OBSERVATIONS = 200_000
"""Approximate length bound of the observation stream."""


@dataclass(frozen=True, slots=True)
class Observation:
    """One handler call.

    Attributes:
        tenant: the ``pl-tenant`` header ("" when absent).
        lane: the lane the handler serves.
        key: the message key (the conversation of a debounced turn).
        event_id: the ``pl-event-id`` header of the message the context carries (a turn's last).
        received_ms: when the ingress accepted the webhook (``pl-received-at-ms``; 0 if absent).
        started_ms: when the handler was called.
        finished_ms: when it returned or raised.
        outcome: see :data:`Outcome`.
        size: events handled in this call (a debounced turn has several).
        attempt: 1 for the first delivery, 2 for the first retry, ...
    """

    tenant: str
    lane: str
    key: str
    event_id: str
    received_ms: int
    started_ms: int
    finished_ms: int
    outcome: Outcome
    size: int
    attempt: int

    @property
    def wait_ms(self) -> int:
        """Time from acceptance at the ingress to the handler call."""
        return max(0, self.started_ms - self.received_ms)

    def fields(self) -> dict[str, str | int]:
        """The stream entry's fields."""
        return {
            "tenant": self.tenant,
            "lane": self.lane,
            "key": self.key,
            "event": self.event_id,
            "recv": self.received_ms,
            "start": self.started_ms,
            "end": self.finished_ms,
            "out": self.outcome,
            "n": self.size,
            "try": self.attempt,
        }

    @classmethod
    def parse(cls, raw: Mapping[bytes, bytes]) -> Observation | None:
        """The observation of a stream entry, or None if the entry is malformed."""
        try:
            text = {k.decode(): v.decode() for k, v in raw.items()}
            outcome = text["out"]
            if outcome not in _OUTCOMES:
                return None
            return cls(
                tenant=text["tenant"],
                lane=text["lane"],
                key=text["key"],
                event_id=text["event"],
                received_ms=int(text["recv"]),
                started_ms=int(text["start"]),
                finished_ms=int(text["end"]),
                outcome=outcome,  # type: ignore[arg-type]  # checked against _OUTCOMES
                size=int(text["n"]),
                attempt=int(text["try"]),
            )
        except (KeyError, ValueError, UnicodeDecodeError):
            return None


class ObservationSink(Protocol):
    """Where observations go."""

    async def record(self, observation: Observation) -> None:
        """Keep ``observation``; never raises."""


class RedisObservations:
    """Observations in the bounded stream :func:`demo.keys.observations`."""

    def __init__(self, redis: Redis, prefix: str, max_len: int = MAX_OBSERVATIONS) -> None:
        """Append to ``prefix``'s observation stream, keeping about ``max_len`` entries."""
        self._redis = redis
        self._key = keys.observations(prefix)
        self._max_len = max_len

    async def record(self, observation: Observation) -> None:
        """``XADD key MAXLEN ~ max_len * fields``; a Redis error is logged, not raised."""
        try:
            await self._redis.xadd(
                self._key,
                observation.fields(),  # type: ignore[arg-type]  # redis-py's FieldT is invariant
                maxlen=self._max_len,
                approximate=True,
            )
        except RedisError as exc:
            log.warning("could not record an observation: %s", exc)

    async def read(self, after_id: str, count: int = 5_000) -> tuple[str, list[Observation]]:
        """Entries after ``after_id`` (``"0"`` for all): the last id read and the observations."""
        entries: Any = await self._redis.xrange(self._key, f"({after_id}", "+", count=count)
        if not entries:
            return after_id, []
        parsed = [Observation.parse(fields) for _, fields in entries]
        last = entries[-1][0]
        return (last.decode() if isinstance(last, bytes) else str(last)), [
            o for o in parsed if o is not None
        ]


def _text(message_headers: Mapping[str, bytes], name: str) -> str:
    raw = message_headers.get(name)
    return raw.decode(errors="replace") if raw else ""


def _observed(
    handler: Handler, sink: ObservationSink, retryable: Retryable, max_attempts: int
) -> Handler:
    @functools.wraps(handler)
    async def call(events: Any, ctx: Context) -> None:
        started_ms = int(time.time() * 1000)
        outcome: Outcome = "ok"
        try:
            await handler(events, ctx)
        except Skip:
            outcome = "skip"
            raise
        except Exception as exc:
            # As the runtime decides: retried while attempts are left, else dead-lettered.
            retry = retryable(exc) and ctx.attempt < max_attempts
            outcome = "retry" if retry else "dead"
            raise
        finally:
            headers = ctx.message.headers
            await sink.record(
                Observation(
                    tenant=_text(headers, h.TENANT),
                    lane=ctx.lane,
                    key=ctx.key or "",
                    event_id=_text(headers, h.EVENT_ID),
                    received_ms=h.int_header(headers, h.RECEIVED_AT_MS),
                    started_ms=started_ms,
                    finished_ms=int(time.time() * 1000),
                    outcome=outcome,
                    size=len(events) if isinstance(events, list) else 1,
                    attempt=ctx.attempt,
                )
            )

    return call


def observe_app(app: App, sink: ObservationSink) -> App:
    """Re-register every ``async`` handler of ``app`` wrapped so each call is observed.

    The wrapper keeps the handler's signature and annotations (``functools.wraps``), so the
    runtime decodes events exactly as for the bare handler. CPU-bound handlers (``cpu=True``)
    run in another process and are left as they are. Returns ``app``.
    """
    for name, lane in list(app.lanes.items()):
        if lane.cpu_ref is not None:
            continue
        wrapped = _observed(lane.handler, sink, app.retryable, lane.routes.max_attempts)
        app.handler(name, time_limit_s=lane.time_limit_s)(wrapped)
    return app
