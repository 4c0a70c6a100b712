"""The log line of a handler's failure: which message, what next, and where the code failed.

A handler that raises is routed to a retry tier or the dead-letter topic
(:class:`~pipeline.runtime.redirect.Redirector`); :class:`FailureLog` then says so, one record
per failure shown:

* an exception the handler raised (a bug, a dependency down): a WARNING naming the lane, the
  message (``topic[partition]@offset``, key, attempt of how many), the exception and what
  happens next (``retry tier <topic>``, ``dead letter (<reason>)``), then its traceback, from
  the runtime's call through the handler's own frame to where it was raised;
* an outcome the handler chose (``Retry``, ``Throttled``, ``DeadLetter``: a
  :class:`~pipeline.errors.HandlerOutcome`): one INFO line, no traceback.

What happens next is what the redirector did (:class:`~pipeline.runtime.redirect.Routed`):
the retry tier it sent the message to, or the dead letter's own reason (``fatal`` for a
ValidationError on the last attempt, ``exhausted`` for a retryable error out of attempts). A
debounced turn's failure (:meth:`FailureLog.turn_failed`) is logged alike, naming how many
messages the turn held and where its last one was read; next, it runs again after backoff or
its messages are dead letters.

Repeats are backed off by a :class:`~pipeline.log_repeats.RepeatFilter` of the member's own,
before anything is formatted: failures are alike when they share lane, exception type and the
frame that raised it (its function and file), whatever the key, offset or exception text, so a
failure storm over many keys is the first line, then one after 1 s, 2 s, 4 s ... up to 60 s,
each saying how many like it were held back; another exception, or the same one raised
elsewhere, is shown at once. A traceback is formatted only for a line shown, and cut:
:data:`HEAD_FRAMES` outermost and :data:`TAIL_FRAMES` innermost frames of each exception, its
text at :data:`MESSAGE_CHARS`, :data:`CHAINED` exceptions of a chain (``raise ... from``), and
the whole at :data:`MAX_TRACEBACK_CHARS`.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence
from types import FrameType

from pipeline.envelope import Message, printable
from pipeline.errors import HandlerOutcome, PoisonMessage
from pipeline.log_repeats import RepeatFilter
from pipeline.runtime.app import Lane
from pipeline.runtime.redirect import Routed

__all__ = [
    "CHAINED",
    "HEAD_FRAMES",
    "MAX_TRACEBACK_CHARS",
    "MESSAGE_CHARS",
    "TAIL_FRAMES",
    "FailureLog",
    "shown_now",
    "traceback_text",
]

log = logging.getLogger(__name__)

HEAD_FRAMES = 8
"""Outermost frames of a traceback kept: the runtime's call, the handler's own and its calls."""
TAIL_FRAMES = 16
"""Innermost frames kept: where it was raised (a RecursionError has about a thousand)."""
MESSAGE_CHARS = 2000
"""Characters of an exception's text in its traceback (a message of 1 MiB is cut)."""
LINE_CHARS = 300
"""Characters of the exception's text on the first line (on one line)."""
KEY_CHARS = 100
"""Characters of the message's key on the first line."""
CHAINED = 3
"""Exceptions of a chain shown (the failure, its cause, the cause's cause)."""
MAX_TRACEBACK_CHARS = 16_000
"""The longest traceback text (its end kept: the exception raised and where)."""

_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


class FailureLog:
    """Logs handler failures, alike ones backed off; one per member."""

    def __init__(self, repeats: RepeatFilter | None = None) -> None:
        """Back off repeats with ``repeats`` (a filter of its own by default)."""
        self._repeats = repeats or RepeatFilter()

    def failed(
        self, lane: Lane, message: Message, attempt: int, error: Exception, routed: Routed
    ) -> None:
        """Say that ``message``'s handler failed with ``error`` and where it was ``routed``.

        Costs a record and a look-up when held back; a traceback only when shown.
        """
        if routed.outcome == "retried":
            then = f"retry tier {routed.detail}"
        elif routed.outcome == "dead_lettered":
            then = f"dead letter ({routed.detail})"
        else:
            then = "not routed, left for redelivery"
        where = f"{message.topic}[{message.partition}]@{message.offset}"
        self._say(lane, error, where, f"key {_key(message)}, ", attempt, then)

    def turn_failed(
        self,
        lane: Lane,
        messages: Sequence[Message],
        attempt: int,
        error: Exception,
        routed: Routed,
    ) -> None:
        """Say that a debounced turn of ``messages`` failed with ``error``, and what comes next.

        ``routed``: ``retried`` (the turn runs again after its backoff), ``dead_lettered`` with
        its reason, or None (its dead letters could not all be produced: it runs again).
        """
        if routed.outcome == "retried":
            then = "run again after backoff"
        elif routed.outcome == "dead_lettered":
            then = f"dead letter ({routed.detail})"
        else:
            then = "not routed, run again after backoff"
        last = messages[-1]
        count = f"{len(messages)} message{'' if len(messages) == 1 else 's'}"
        where = f"a turn of {count} up to {last.topic}[{last.partition}]@{last.offset}"
        self._say(lane, error, where, "", attempt, then)

    def _say(
        self, lane: Lane, error: Exception, where: str, about: str, attempt: int, then: str
    ) -> None:
        """The line of a failure on ``where`` (``about`` it, before the attempt), unless held."""
        # PoisonMessage is the runtime's verdict on a turn whose runs never finished.
        chosen = isinstance(error, HandlerOutcome) and not isinstance(error, PoisonMessage)
        level = logging.INFO if chosen else logging.WARNING
        if not log.isEnabledFor(level):
            return
        kind = f"lane {lane.name}: handler {'chose' if chosen else 'failed'}: {_type_name(error)}"
        # Judged as a warning whatever the level: an INFO line of a storm (a dependency's 429s)
        # must back off too, and the filter lets anything below WARNING through.
        held = shown_now(self._repeats, log, f"{kind} in {_place(error)}")
        if held is None:
            return
        what = f"chose {type(error).__name__} for" if chosen else "failed on"
        said = _one_line(error) if chosen else f"{_type_name(error)}: {_one_line(error)}"
        head = (
            f"lane {lane.name}: handler {what} {where} ({about}attempt {attempt} of"
            f" {lane.routes.max_attempts}): {said}; next: {then}{held}"
        )
        if chosen:
            log.info("%s", head)
        else:
            log.warning("%s\n%s", head, traceback_text(error))


def shown_now(repeats: RepeatFilter, logger: logging.Logger, alike: str) -> str | None:
    """Whether a warning of ``logger`` alike to those named ``alike`` is shown, by ``repeats``.

    None: it is held back. Otherwise what its line ends with: ``" [N more like this in the last
    Gs]"`` when some alike were held back, else nothing. Only ``alike`` is judged (its numbers
    blanked), so lines whose own text differs each time (a key, an error's text) are backed off
    by what they are about, and nothing of one held back is formatted.
    """
    gate = logging.LogRecord(logger.name, logging.WARNING, __file__, 0, alike, None, None)
    if not repeats.filter(gate):
        return None
    return str(gate.msg)[len(alike) :]


def _type_name(error: BaseException) -> str:
    """The exception's class as a traceback names it (module-qualified unless a builtin)."""
    kind = type(error)
    module = kind.__module__
    if module in ("builtins", "__main__"):
        return kind.__qualname__
    return f"{module}.{kind.__qualname__}"


def _place(error: BaseException) -> str:
    """Where ``error`` was raised: the innermost frame's function and file (no line number)."""
    tb = error.__traceback__
    if tb is None:
        return "?"
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return f"{code.co_name} ({code.co_filename})"


def _text(error: BaseException) -> str:
    """``str(error)``, or a note when its ``__str__`` raises."""
    try:
        return str(error)
    except Exception:  # a broken __str__ of the app's must not break the log line
        return f"<{type(error).__name__}.__str__ raised>"


def _one_line(error: BaseException) -> str:
    """The exception's text on one line, cut at :data:`LINE_CHARS`."""
    text = _text(error)
    cut = " ".join(text[: LINE_CHARS + 1].split())
    return cut[: LINE_CHARS - 3] + "..." if len(cut) > LINE_CHARS or len(text) > LINE_CHARS else cut


def _key(message: Message) -> str:
    """The message's key for the line (its text, base64 if not UTF-8), cut."""
    key = printable(message.key, base64_mark="base64:")
    if key is None:
        return "none"
    return key if len(key) <= KEY_CHARS else key[: KEY_CHARS - 3] + "..."


def traceback_text(error: BaseException) -> str:
    """``error``'s traceback as Python prints it, bounded (see the module's description)."""
    chain: list[tuple[BaseException, str]] = [(error, "")]  # newest first, each with its link
    seen = {id(error)}
    current: BaseException = error
    left_out = False
    while True:
        if current.__cause__ is not None:
            older, link = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            older, link = current.__context__, _CONTEXT
        else:
            break
        if id(older) in seen:
            break
        if len(chain) == CHAINED:
            left_out = True
            break
        seen.add(id(older))
        chain.append((older, link))
        current = older
    parts = ["(older exceptions of the chain left out)\n"] if left_out else []
    for index in range(len(chain) - 1, -1, -1):
        parts.append(_one_exception(chain[index][0]))
        if index:
            parts.append(chain[index - 1][1])
    text = "".join(parts).rstrip("\n")
    if len(text) > MAX_TRACEBACK_CHARS:
        cut = len(text) - MAX_TRACEBACK_CHARS
        text = f"({cut} characters left out)\n{text[cut:]}"
    return text


def _one_exception(error: BaseException) -> str:
    """One exception's frames (the outermost and innermost kept) and its cut text."""
    frames: list[tuple[FrameType, int]] = []
    tb = error.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    lines = ["Traceback (most recent call last):\n"] if frames else []
    if len(frames) > HEAD_FRAMES + TAIL_FRAMES:
        lines += traceback.StackSummary.extract(iter(frames[:HEAD_FRAMES])).format()
        lines.append(f"  ... {len(frames) - HEAD_FRAMES - TAIL_FRAMES} frames left out ...\n")
        lines += traceback.StackSummary.extract(iter(frames[-TAIL_FRAMES:])).format()
    else:
        lines += traceback.StackSummary.extract(iter(frames)).format()
    text = _text(error)
    if len(text) > MESSAGE_CHARS:
        text = f"{text[:MESSAGE_CHARS]}... ({len(text) - MESSAGE_CHARS} characters left out)"
    lines.append(f"{_type_name(error)}: {text}\n" if text else f"{_type_name(error)}\n")
    return "".join(lines)
