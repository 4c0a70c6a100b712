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
before anything is formatted: failures are alike when they share lane, exception type, the
frame that raised it (its function and file) and what happens next (retry, or dead letter and
its reason), whatever the key, offset or exception text, so a
failure storm over many keys is the first line, then one after 1 s, 2 s, 4 s ... up to 60 s,
each saying how many like it were held back; another exception, or the same one raised
elsewhere, is shown at once. A traceback is formatted only for a line shown, and cut:
:data:`HEAD_FRAMES` outermost and :data:`TAIL_FRAMES` innermost frames of each exception, its
text at :data:`MESSAGE_CHARS`, :data:`CHAINED` exceptions of a chain (``raise ... from``), and
the whole at :data:`MAX_TRACEBACK_CHARS`. An exception's notes (``add_note``) are printed, the
first :data:`NOTES`, each cut at :data:`NOTE_CHARS`; an exception group's (a ``TaskGroup`` in a
handler) first :data:`GROUP_SHOWN` sub-exceptions too, each with its own traceback, and its
place is its first sub-exception's (recursively), so two groups of one ``TaskGroup`` are alike
only when their first failures are. A CPU lane's exception comes back from its worker without
its traceback: the worker adds it as a note (:func:`worker_note`), which is printed and gives
the failure its place.

What happens next is part of what makes failures alike (``retry`` or ``dead letter
(<reason>)``): a dead letter's line is held back only behind an alike dead letter's, never
behind a retried failure's. A dead letter this log warns of (its line says ``next: dead letter
(<reason>)`` with the redrive hint) is routed within :meth:`FailureLog.telling`, so that the
member's dead-letter warning (:class:`~pipeline.runtime.progress.DeadLetterWarnings`) does not
say it again (:func:`told`); when that routing ends without a line saying ``dead letter``
(cancelled by a shutdown or a revocation halfway through a turn's dead letters, or a turn's
later dead letter not produced: its line says ``not routed``), the warnings left out are given
after all, each on its own (one that fails skips none of the others). Nothing of the
failure stays in the context once its routing ends: tasks started during it (a Kafka
producer's delivery reports, started by its first send) copy the context, and would keep the
exception, its traceback and the handler's locals for the producer's life.
A failure the runtime made with no frame of the app's (a turn's ``PoisonMessage``, never
raised) has no failure line: its dead letter keeps its own warning.
A line shown is marked :data:`~pipeline.log_repeats.JUDGED`, so the root handler's repeat filter
neither stores it nor holds it back; alike ones are told apart by an exact key
(:data:`~pipeline.log_repeats.REPEAT_KEY`, numbers not blanked: lane ``orders1`` is not
``orders2``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from types import FrameType
from typing import TYPE_CHECKING

from pipeline.envelope import Message, printable
from pipeline.errors import HandlerOutcome, PipelineError, PoisonMessage
from pipeline.log_repeats import JUDGED, RepeatFilter, error_text, shown_now

if TYPE_CHECKING:  # annotations only: the CPU pool's worker imports this module, app imports it
    from pipeline.runtime.app import Lane
    from pipeline.runtime.redirect import Routed

__all__ = [
    "CHAINED",
    "GROUP_SHOWN",
    "HEAD_FRAMES",
    "MAX_TRACEBACK_CHARS",
    "MESSAGE_CHARS",
    "NOTES",
    "NOTE_CHARS",
    "TAIL_FRAMES",
    "FailureLog",
    "drop_worker_notes",
    "told",
    "traceback_text",
    "worker_note",
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
NOTES = 5
"""Notes of an exception printed (``add_note``), the first ones; a CPU worker's always."""
NOTE_CHARS = 500
"""Characters of each note printed."""
GROUP_SHOWN = 3
"""Sub-exceptions of an exception group printed, the first ones, each with its traceback."""
GROUP_DEPTH = 3
"""Exception groups nested in each other printed (and looked into for a failure's place)."""
_SUB_CHARS = MAX_TRACEBACK_CHARS // (GROUP_SHOWN + 1)
"""The longest text of one sub-exception (its end kept)."""
WORKER_TRACEBACK_CHARS = MAX_TRACEBACK_CHARS // 2
"""The longest traceback a CPU worker sends back as a note (its end kept)."""

_WORKER_HEAD = re.compile(r"CPU worker \d+: raised in (.+)")
"""The first line of a CPU worker's note: where its handler raised (see :func:`worker_note`)."""


class _Telling:
    """The failure whose routing goes on, and the dead-letter warnings left out meanwhile.

    Emptied when the routing ends: tasks started during it keep the context (this object),
    never the exception.
    """

    __slots__ = ("error", "left_out", "said")

    def __init__(self, error: BaseException) -> None:
        self.error: BaseException | None = error
        self.left_out: list[Callable[[], None]] = []
        self.said = False
        """Whether the failure's line said ``dead letter``: the warnings left out stay out."""


_TELLING: ContextVar[_Telling | None] = ContextVar("pipeline_failure_telling", default=None)
"""The failure whose routing is going on, when this log's line will tell where it went."""

_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


class FailureLog:
    """Logs handler failures, alike ones backed off; one per member."""

    def __init__(self, repeats: RepeatFilter | None = None) -> None:
        """Back off repeats with ``repeats`` (a filter of its own by default)."""
        self._repeats = repeats or RepeatFilter()

    def tells(self, error: BaseException) -> bool:
        """Whether this log warns of a failure with ``error`` (shown, or held back as alike).

        Not of an outcome the handler chose: its line is INFO, and the dead-letter warning
        stays the one line a member at WARNING gives of a ``DeadLetter`` raised on purpose;
        nor of a failure the runtime made (:func:`_runtime_made`), which has no line.
        """
        return not _chosen(error) and not _runtime_made(error) and log.isEnabledFor(logging.WARNING)

    @contextlib.contextmanager
    def telling(self, error: BaseException | None) -> Iterator[None]:
        """Route ``error``'s failure within this: its dead letters are told by this log's line.

        The failure's line (:meth:`failed`, :meth:`turn_failed`) is given within this too. The
        member's dead-letter warning then leaves them out (:func:`told`); nothing changes
        when this log does not warn of it (:meth:`tells`), or without an error. Unless that
        line said ``dead letter`` (the routing cancelled halfway through a turn's dead letters
        by a shutdown or a revocation; a turn's later dead letter not produced, its line
        saying ``not routed``), no line tells the dead letters already produced: their
        warnings are given, each on its own, and an exception ending the routing (a
        ``CancelledError``) still goes on.
        """
        if error is None or not self.tells(error):
            yield
            return
        telling = _Telling(error)
        token = _TELLING.set(telling)
        try:
            yield
        finally:
            untold = [] if telling.said else list(telling.left_out)
            telling.error = None  # a task started meanwhile copied the context, not the error
            telling.left_out.clear()
            _TELLING.reset(token)
            for warn in untold:  # no line said dead letter: each says its own
                with contextlib.suppress(Exception):  # nor skips the rest, nor replaces a cancel
                    warn()

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
        self._say(lane, error, where, f"key {_key(message)}, ", attempt, then, _next(routed))
        _said_dead_letter(error, routed)

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
        self._say(lane, error, where, "", attempt, then, _next(routed))
        _said_dead_letter(error, routed)

    def _say(
        self,
        lane: Lane,
        error: Exception,
        where: str,
        about: str,
        attempt: int,
        then: str,
        outcome: str,
    ) -> None:
        """The line of a failure on ``where`` (``about`` it, before the attempt), unless held.

        ``outcome`` (:func:`_next`) is part of what makes lines alike.
        """
        if _runtime_made(error):  # no frame of the app's: its dead letter says it
            return
        chosen = _chosen(error)
        level = logging.INFO if chosen else logging.WARNING
        if not log.isEnabledFor(level):
            return
        verb = "chose" if chosen else "failed"
        kind = f"lane {lane.name}: handler {verb}: {_alike(error)}; next: {outcome}"
        # Judged as a warning whatever the level: an INFO line of a storm (a dependency's 429s)
        # must back off too, and the filter lets anything below WARNING through.
        held = shown_now(self._repeats, log, kind)
        if held is None:
            return
        what = f"chose {type(error).__name__} for" if chosen else "failed on"
        said = _one_line(error) if chosen else _said(error)
        if then.startswith("dead letter") and not chosen:  # the one line its dead letter has
            then += f" (inspect: pipeline redrive {lane.routes.dead_letter_topic} --dry-run)"
        head = (
            f"lane {lane.name}: handler {what} {where} ({about}attempt {attempt} of"
            f" {lane.routes.max_attempts}): {said}; next: {then}{held}"
        )
        judged = {JUDGED: True}  # backed off here: the root handler's filter lets it be
        if chosen:
            log.info("%s", head, extra=judged)
        else:
            log.warning("%s\n%s", head, traceback_text(error), extra=judged)


def told(error: BaseException | None, warning: Callable[[], None]) -> bool:
    """Whether a dead letter of ``error`` is told by the failure log's line: leave it out.

    True while its routing goes on within :meth:`FailureLog.telling`; ``warning`` (the dead
    letter's own) is then kept, and given if that routing ends without a failure line saying
    ``dead letter``.
    """
    telling = _TELLING.get()
    if error is None or telling is None or telling.error is not error:
        return False
    telling.left_out.append(warning)
    return True


def _said_dead_letter(error: BaseException, routed: Routed) -> None:
    """Mark ``error``'s routing (:meth:`FailureLog.telling`) told when its line said dead letter.

    Shown, or held back behind an alike dead letter's line: either way the warnings left out
    (:func:`told`) stay out. Any other line (``not routed``) leaves them to be given.
    """
    telling = _TELLING.get()
    if routed.outcome == "dead_lettered" and telling is not None and telling.error is error:
        telling.said = True


def _next(routed: Routed) -> str:
    """What happened next, as alike lines share it: ``retry``, ``dead letter (<reason>)``."""
    if routed.outcome == "retried":
        return "retry"
    if routed.outcome == "dead_lettered":
        return f"dead letter ({routed.detail})"
    return "not routed"


def _chosen(error: BaseException) -> bool:
    """Whether ``error`` is an outcome the handler chose (INFO, no traceback)."""
    # PoisonMessage is the runtime's verdict on a turn whose runs never finished.
    return isinstance(error, HandlerOutcome) and not isinstance(error, PoisonMessage)


def _runtime_made(error: BaseException) -> bool:
    """Whether ``error`` is the runtime's own, with no frame of the app's: it has no line.

    A turn's ``PoisonMessage`` (made, never raised), or an error of the pipeline's with no
    traceback and no CPU worker's note (one a CPU worker sent back has its note).
    """
    if isinstance(error, PoisonMessage):
        return True
    return (
        isinstance(error, PipelineError)
        and error.__traceback__ is None
        and _worker_place(error) is None
    )


def _type_name(error: BaseException) -> str:
    """The exception's class as a traceback names it (module-qualified unless a builtin)."""
    kind = type(error)
    module = kind.__module__
    if module in ("builtins", "__main__"):
        return kind.__qualname__
    return f"{module}.{kind.__qualname__}"


def _first_leaf(error: BaseException) -> BaseException:
    """An exception group's first sub-exception, looked into :data:`GROUP_DEPTH` deep; else it."""
    for _ in range(GROUP_DEPTH):
        if not isinstance(error, BaseExceptionGroup) or not error.exceptions:
            break
        error = error.exceptions[0]
    return error


def _alike(error: BaseException) -> str:
    """What makes failures alike: the exception's type (a group's, its first's) and place."""
    leaf = _first_leaf(error)
    kind = _type_name(error) if leaf is error else f"{_type_name(error)} of {_type_name(leaf)}"
    return f"{kind} in {_place(error)}"


def _place(error: BaseException) -> str:
    """Where ``error`` was raised: the innermost frame's function and file (no line number).

    A CPU worker's is its note's, read at each level of a group first (the worker notes the
    group it sends back; its sub-exceptions come without tracebacks); an exception group's is
    its first sub-exception's.
    """
    for _ in range(GROUP_DEPTH + 1):
        worker = _worker_place(error)
        if worker is not None:
            return worker
        if not isinstance(error, BaseExceptionGroup) or not error.exceptions:
            break
        error = error.exceptions[0]
    tb = error.__traceback__
    if tb is None:
        return "?"
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    return f"{code.co_name} ({code.co_filename})"


def _is_worker_note(note: str) -> bool:
    """Whether ``note`` is a CPU worker's (:func:`worker_note`)."""
    return _WORKER_HEAD.match(note.partition("\n")[0]) is not None


def _worker_place(error: BaseException) -> str | None:
    """Where a CPU worker's note says ``error`` was raised; None without such a note."""
    for note in _notes_of(error):
        head = _WORKER_HEAD.match(note.partition("\n")[0])
        if head is not None:
            return head.group(1)
    return None


def _text(error: BaseException) -> str:
    """``str(error)``, or a placeholder when its ``__str__`` raises."""
    return error_text(error)


def _said(error: BaseException) -> str:
    """A failure's exception on the first line: its type and text (a group's first failure's)."""
    said = f"{_type_name(error)}: {_one_line(error)}"
    leaf = _first_leaf(error)
    if leaf is not error:
        said += f" (first: {_type_name(leaf)}: {_one_line(leaf)})"
    return said


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


def worker_note(error: BaseException) -> str:
    """The note a CPU worker adds to ``error`` before sending it back: where, and its traceback.

    The traceback is cut at :data:`WORKER_TRACEBACK_CHARS`; ``error``'s own notes are left out
    of it (they travel as themselves).
    """
    text = _cut(traceback_text(error, notes=False), WORKER_TRACEBACK_CHARS)
    return f"CPU worker {os.getpid()}: raised in {_place(error)}\n{text}"


def drop_worker_notes(error: BaseException) -> None:
    """Take CPU workers' notes (:func:`worker_note`) off ``error``, its other notes kept.

    A worker notes the exception it sends back, which may be the app's own object (one
    instance raised each time): the note is taken off once sent, or it would grow by a note
    per failure for the worker's life.
    """
    notes = getattr(error, "__notes__", None)
    if not isinstance(notes, list):
        return
    kept = [n for n in notes if not (isinstance(n, str) and _is_worker_note(n))]
    if len(kept) == len(notes):
        return
    if kept:
        notes[:] = kept
    else:
        del error.__notes__


def traceback_text(error: BaseException, *, notes: bool = True) -> str:
    """``error``'s traceback as Python prints it, bounded (see the module's description).

    ``notes``: print ``error``'s own notes (those of its chain and sub-exceptions always).
    """
    return _cut(_chain_text(error, 0, notes=notes), MAX_TRACEBACK_CHARS)


def _cut(text: str, most: int) -> str:
    """``text``, or its end when longer than ``most`` characters, saying how many were left."""
    if len(text) <= most:
        return text
    cut = len(text) - most
    return f"({cut} characters left out)\n{text[cut:]}"


def _chain_text(error: BaseException, depth: int, *, notes: bool = True) -> str:
    """``error`` and up to :data:`CHAINED` - 1 exceptions of its chain, oldest first."""
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
        parts.append(_one_exception(chain[index][0], depth, notes=notes or index > 0))
        if index:
            parts.append(chain[index - 1][1])
    return "".join(parts).rstrip("\n")


def _one_exception(error: BaseException, depth: int, *, notes: bool) -> str:
    """One exception's frames (outermost and innermost kept), cut text, notes, sub-exceptions."""
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
    if notes:
        lines += _printed_notes(error)
    if isinstance(error, BaseExceptionGroup):
        lines += _members(error, depth)
    return "".join(lines)


def _notes_of(error: BaseException) -> list[str]:
    """``error``'s notes that are text (``__notes__`` is a list anyone may fill)."""
    try:
        notes = getattr(error, "__notes__", None)
    except Exception:  # an exception class of the app's with a __getattr__ that raises
        return []
    if not isinstance(notes, list | tuple):
        return []
    return [note for note in notes if isinstance(note, str)]


def _printed_notes(error: BaseException) -> list[str]:
    """The first :data:`NOTES` notes, each cut, then a CPU worker's (already bounded)."""
    notes = _notes_of(error)
    worker = [n for n in notes if _WORKER_HEAD.match(n.partition("\n")[0])]
    own = [n for n in notes if not _WORKER_HEAD.match(n.partition("\n")[0])]
    lines = []
    for note in own[:NOTES]:
        cut = note if len(note) <= NOTE_CHARS else f"{note[:NOTE_CHARS]}... (cut)"
        lines.append(f"{cut}\n")
    if len(own) > NOTES:
        lines.append(f"({len(own) - NOTES} more notes left out)\n")
    lines += [f"{_cut(note, WORKER_TRACEBACK_CHARS + 200)}\n" for note in worker]
    return lines


def _members(group: BaseExceptionGroup[BaseException], depth: int) -> list[str]:
    """A group's first :data:`GROUP_SHOWN` sub-exceptions, each its traceback, set off by ``|``."""
    count = len(group.exceptions)
    if depth + 1 >= GROUP_DEPTH:
        return [f"  ({count} sub-exceptions of groups nested deeper left out)\n"]
    lines = []
    for number, sub in enumerate(group.exceptions[:GROUP_SHOWN], 1):
        lines.append(f"  +---------------- {number} of {count} ----------------\n")
        text = _cut(_chain_text(sub, depth + 1), _SUB_CHARS)
        lines += [f"  | {line}\n" for line in text.splitlines()]
    if count > GROUP_SHOWN:
        lines.append(f"  +---------------- {count - GROUP_SHOWN} more left out ----------------\n")
    return lines
