"""Move selected dead letters back to their origin topic, resumably and at a capped rate.

Only a declared dead-letter topic is taken (:func:`require_dead_letter_topic`): redriving a
main or retry topic would copy live traffic. The DLQ is read by a consumer group named after
the DLQ, the target and the filters as typed (``--since 2h`` stays ``2h``, see
:meth:`~pipeline.redrive.select.Selection.typed_as`), up to the end offsets seen at start. A
message that passes the filters is produced to ``--to`` or to its origin topic with its original
key, value and event id (one without: its first delivery's position, the name ``ctx.once`` knew
it by, :func:`redriven`), its failure headers removed and ``pl-redrive-count`` raised by one; a
message already redriven ``max_redrives`` times is refused (it would loop). Positions are
committed after each produced batch, and a stop (cancellation; Ctrl-C or SIGTERM in
``pipeline redrive``) in the middle of one waits for the broker's answer to the records on their
way and commits what was already produced, so an interrupted redrive run again with the same
arguments continues where it stopped: nothing is moved twice, except the one batch in flight if
the process was killed (not stopped) in the middle of it. A dead letter left in the DLQ (no
origin to go back to, redriven too often, or refused by its target as too large) is counted and
named in one warning line (where it is, why, what to do), and the run goes on past it. A
``limit`` counts the dead letters the run sends (or, dry, would send): those left in the DLQ
before a send do not count, so ``--limit 100`` moves 100 if the DLQ has them (one its target
refuses as too large, known only once sent, counts). A run stopped there counts the DLQ's
messages it did not reach (:attr:`Report.unread`): the same command run again reads them. Messages
that expired or were trimmed from the DLQ, before the run or while it runs, are neither waited
for nor counted. A dry run counts from the position of the redrive it previews, read by a
reader in no consumer group (:meth:`~pipeline.transport.protocol.Transport.reader`, so dry runs
at the same time each read every partition): it commits nothing, moves no group's position and,
even killed, leaves nothing on the broker.

A partition of the DLQ the broker cannot read (a Redis stream key another program overwrote
with another type: :attr:`~pipeline.transport.protocol.PartitionLag.unreadable`), found at the
start or while the run waits for it, is set aside with one warning line (which partition, why,
what to do) and the others are redriven; a run that set one aside then fails
(:class:`~pipeline.errors.TransportError`, exit 1) after committing what it moved, a dry run
counts the others and returns (:attr:`Report.unreadable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from pipeline import headers as h
from pipeline import tracing
from pipeline.envelope import Delivered, Message, Position, Record, TopicPartition
from pipeline.errors import ConfigError, MessageTooLarge, TransportError
from pipeline.offload.writer import Offloader, OffloadingProducer
from pipeline.redrive.select import Selection, reason
from pipeline.times import utc_time
from pipeline.topics.spec import TopicSpec
from pipeline.transport.partitioner import partition_for
from pipeline.transport.protocol import Admin, Consumer, Producer, Reader, TopicInfo, Transport

_DROPPED_HEADERS = {
    h.ATTEMPT,
    h.DUE_MS,
    h.ERROR_CLASS,
    h.ERROR_MESSAGE,
    h.ERROR_DIGEST,
    h.FIRST_FAILURE_MS,
    h.LAST_FAILURE_MS,
    h.DEAD_REASON,
    h.ORIGIN_TOPIC,
    h.ORIGIN_PARTITION,
    h.ORIGIN_OFFSET,
    h.SLA_FROM_MS,
}
_DECIMAL = re.compile(rb"[0-9]{1,19}")
"""A partition or offset as the origin headers write it."""
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
"""A name a topic can have on either broker (Kafka's rule); any other names none there is."""
_RECHECK_S = 2.0
"""How often at most a run whose polls bring nothing asks which messages the DLQ still holds."""
_SHOWN_CHARS = 80
"""The longest a key or header is shown in a line (a hostile one can be megabytes)."""
_PIN_BYTES = 3_500
"""The longest commit metadata a redrive's pin (:class:`_Pin`) takes, below Kafka's 4096."""
_BATCH = 200
"""The most messages read at once; under a rate cap, at most a second's worth (:meth:`_poll`)."""
_ROOM_BYTES = 1_024
"""Room for a batch's framing (Kafka: a 61-byte header) below ``max.message.bytes`` (_chunks)."""
_RECORD_FRAMING = 36
"""The most a record's own framing takes in a Kafka batch (its varints: length, attributes,
timestamp and offset deltas, key and value lengths, header count), beyond :attr:`Record.size`."""
_HEADER_FRAMING = 10
"""The most each header's framing takes in a Kafka batch (its name's and value's lengths)."""

log = logging.getLogger(__name__)


@dataclass
class Report:
    """What a redrive saw and did."""

    scanned: int = 0
    selected: int = 0
    moved: int = 0
    refused_loops: int = 0
    no_origin: int = 0
    """Selected but left in the DLQ: no origin topic, or one naming the DLQ or no topic there is."""
    too_large: int = 0
    """Selected but left in the DLQ: the target refused it as larger than it takes."""
    reasons: Counter[str] = field(default_factory=Counter)
    moved_to: Counter[str] = field(default_factory=Counter)
    unread: int = 0
    """Messages of the DLQ (up to its end seen at start) a run stopped at its limit did not read:
    the same command run again reads them (those expired meanwhile excepted)."""
    unidentified: int = 0
    """Moved (or, dry, to move) without an event id, their dead letters having neither one nor a
    first delivery to name them by (:func:`first_delivery`; produced by hand): a handler's
    ``ctx.once`` takes each for a new event and runs its effects again."""
    unreadable: dict[int, str] = field(default_factory=dict)
    """Partitions of the DLQ not read, each with why (the broker's words: which key, what to do);
    the others were redriven (or, dry, counted)."""

    @property
    def left(self) -> int:
        """Selected dead letters left in the DLQ, each named in a warning: the run passed them."""
        return self.refused_loops + self.no_origin + self.too_large


def require_dead_letter_topic(name: str, specs: Sequence[TopicSpec]) -> None:
    """Return if ``name`` is the dead-letter topic of a declared topic.

    Raises:
        ConfigError: it is not (a main or retry topic, or undeclared).
    """
    dead_letters = sorted({spec.dead_letter for spec in specs})
    if name not in dead_letters:
        hint = next(
            (
                f" did you mean {spec.dead_letter!r}?"
                for spec in specs
                if name == spec.name or name in spec.retry_topic_names()
            ),
            "",
        )
        raise ConfigError(
            f"{name!r} is not a dead-letter topic declared in the topics directory;{hint} "
            f"redrive takes only those ({', '.join(dead_letters) or 'none declared'})"
        )


def group_name(dlq: str, target: str | None, selection: Selection) -> str:
    """The consumer group that remembers how far this redrive got."""
    typed = f"{target}|{selection.fingerprint()}".encode(errors="surrogateescape")  # as typed
    digest = hashlib.sha256(typed).hexdigest()[:10]
    return f"pipeline-redrive.{dlq}.{digest}"


def redriven(message: Message, dlq_name: str) -> Record:
    """The message as it goes back: same key and value, failure headers gone, count raised.

    A dead letter without an event id goes back with its first delivery's position as one
    (:func:`first_delivery`), the name ``ctx.once`` knew the event by: its origin headers are
    removed (on a main topic they would be read as another producer's), and without them the
    message would be a new event whose effects run again.
    """
    out = {k: v for k, v in message.headers.items() if k not in _DROPPED_HEADERS}
    out[h.REDRIVE_COUNT] = b"%d" % (h.int_header(message.headers, h.REDRIVE_COUNT) + 1)
    out[h.REDRIVEN_FROM] = f"{dlq_name}:{message.partition}:{message.offset}".encode()
    if not out.get(h.EVENT_ID):
        first = first_delivery(message.headers)
        if first is not None:
            out[h.EVENT_ID] = first
    return Record(message.value, message.key, out)


def first_delivery(headers: Mapping[str, bytes]) -> bytes | None:
    """``topic:partition:offset`` of a dead letter's first delivery, or None if it names none.

    The retry router writes it in the origin headers of every copy: it is what the idempotency
    guard names an event without ``pl-event-id`` by
    (:func:`~pipeline.retry.guard_store.message_id`). A dead letter produced by hand (or one
    lacking its partition or offset, or with one that is no decimal number) names none.
    """
    topic = headers.get(h.ORIGIN_TOPIC)
    partition = headers.get(h.ORIGIN_PARTITION, b"")
    offset = headers.get(h.ORIGIN_OFFSET, b"")
    if not topic or not (_DECIMAL.fullmatch(partition) and _DECIMAL.fullmatch(offset)):
        return None
    return b"%s:%s:%s" % (topic, partition, offset)


@dataclass(frozen=True)
class _Pin:
    """The times a redrive's ``--since``/``--until`` resolved to when it began, and its ends.

    The ends are those it then read to, per partition. It rides on its commits as their
    metadata, ``redrive-times:S:U:0=E0,1=E1,...`` (S or U empty when not given).
    """

    since_ms: int | None
    until_ms: int | None
    ends: dict[int, int]

    _PREFIX = "redrive-times:"

    def text(self) -> str:
        """The metadata committed with each position."""
        since = "" if self.since_ms is None else str(self.since_ms)
        until = "" if self.until_ms is None else str(self.until_ms)
        ends = ",".join(f"{p}={end}" for p, end in sorted(self.ends.items()))
        text = f"{self._PREFIX}{since}:{until}:{ends}"
        # Kafka refuses metadata above offset.metadata.max.bytes (4096 by default): a DLQ of some
        # 250 partitions and more is not pinned (each run selects by its own clock, as before).
        return text if len(text) <= _PIN_BYTES else ""

    @classmethod
    def parse(cls, metadata: str) -> _Pin | None:
        """The pin of ``metadata``, or None if it holds none (or one this cannot read)."""
        if not metadata.startswith(cls._PREFIX):
            return None
        try:
            since, until, ends = metadata[len(cls._PREFIX) :].split(":")
            return cls(
                int(since) if since else None,
                int(until) if until else None,
                {
                    int(p): int(end)
                    for p, end in (pair.split("=") for pair in ends.split(",") if pair)
                },
            )
        except ValueError:
            return None


@dataclass
class _Batch:
    """One poll's messages in order, each marked once settled: produced, or nothing to produce."""

    messages: list[Message]
    settled: list[bool] = field(init=False)

    def __post_init__(self) -> None:
        self.settled = [False] * len(self.messages)

    def positions(self) -> list[Position]:
        """The positions that may be committed, contiguous per partition.

        Each is the position after the partition's last message settled together with every
        earlier message of that partition in the batch.
        """
        after: dict[TopicPartition, int] = {}
        held: set[TopicPartition] = set()
        for message, settled in zip(self.messages, self.settled, strict=True):
            if not settled:
                held.add(message.tp)
            elif message.tp not in held:
                after[message.tp] = message.offset + 1
        return [Position(tp, offset) for tp, offset in after.items()]


class Redrive:
    """One redrive run over one dead-letter topic."""

    def __init__(
        self,
        transport: Transport,
        dlq: str,
        selection: Selection,
        *,
        to: str | None = None,
        limit: int | None = None,
        rate_per_s: float | None = None,
        max_redrives: int = 3,
        dry_run: bool = False,
        offloader: Offloader | None = None,
    ) -> None:
        """Configure the run; :meth:`run` does it.

        ``offloader`` (the lanes' offload policies): a redriven reference's object last written
        a day ago or more is written again before the reference goes back
        (:meth:`~pipeline.offload.writer.Offloader.keep`), so the payload purge keeps it.
        """
        self._transport = transport
        self._dlq = dlq
        self._selection = selection
        self._to = to
        self._limit = limit
        self._interval_s = 1 / rate_per_s if rate_per_s else 0.0
        self._batch = max(1, min(_BATCH, int(rate_per_s))) if rate_per_s else _BATCH
        self._max_redrives = max_redrives
        self._dry_run = dry_run
        self._offloader = offloader
        self._topics: dict[str, TopicInfo | None] = {}  # target -> as the broker told (None: gone)
        self._pin: _Pin | None = None  # the times the redrive began with (--since/--until)
        self._pinned = selection  # the selection by those times
        self._taken = 0  # dead letters sent or, dry, that would be: what ``limit`` counts
        self.report = Report()

    async def total(self) -> int:
        """Messages of the DLQ still ahead of this redrive's position (for a progress bar).

        Expired or trimmed messages are not counted: no run can read them.
        """
        admin = self._transport.admin()
        try:
            starts = await self._starts(admin)
        finally:
            await admin.close()
        return sum(end - first for first, end in starts.values())

    async def _starts(self, admin: Admin) -> dict[TopicPartition, tuple[int, int]]:
        """Per partition, the first offset this run reads and the end seen now.

        The first is the redrive's committed position, or the first message the partition
        still holds if those before it expired or were trimmed. A dry run starts where the
        real run's group is, so that it counts only what that run has still ahead.
        """
        base = group_name(self._dlq, self._to, self._selection)
        starts = {}
        for p in await admin.group_lag(base, self._dlq):
            if p.unreadable is not None:
                self._set_aside(p.tp, p.unreadable)
            else:
                starts[p.tp] = (min(max(p.committed or 0, p.start or 0), p.end), p.end)
        return starts

    def _set_aside(self, tp: TopicPartition, why: str) -> None:
        """Leave partition ``tp`` of the DLQ unread, saying so once: which, why, what to do."""
        if tp.partition in self.report.unreadable:
            return
        self.report.unreadable[tp.partition] = why
        log.warning(
            "%s[%d] is not read by this %s: %s; the other partitions are; once the key is"
            " deleted, the same command reads this one again",
            self._dlq,
            tp.partition,
            "dry run" if self._dry_run else "redrive",
            why,
        )

    async def run(self, progress: Callable[[int], None] | None = None) -> Report:
        """Scan the DLQ up to its current end and move (or, dry, count) what is selected.

        A stop (cancellation, Ctrl-C) in the middle of a batch commits the positions of what was
        already produced before it propagates, so the next run does not send that again.

        Raises:
            TransportError: (not dry) a partition of the DLQ could not be read (each named in
                a warning, :attr:`Report.unreadable`); the others were redriven and committed.
        """
        admin = self._transport.admin()
        try:
            await self._run(admin, progress)
        finally:
            await admin.close()
        if self.report.unreadable and not self._dry_run:
            raise TransportError(self._not_read())
        return self.report

    def _not_read(self) -> str:
        """The line a run that left partitions unread fails with: what it did, what to do."""
        report = self.report
        partitions = ", ".join(f"{self._dlq}[{p}]" for p in sorted(report.unreadable))
        whys = "; ".join(report.unreadable[p] for p in sorted(report.unreadable))
        return (
            f"redrive of {self._dlq} moved {report.moved} of {report.selected} selected dead"
            f" letters (committed) but could not read {partitions}: {whys}; then run the same"
            " command again"
        )

    async def _run(self, admin: Admin, progress: Callable[[int], None] | None) -> None:
        if self._to is not None and not await self._takes(admin, self._to):
            raise ConfigError(
                f"--to {self._to!r}: no such topic, or the dead-letter topic being redriven;"
                " name a topic that exists (`pipeline topics list`)"
            )
        # Read each partition from this redrive's position up to the end seen now; one holding
        # nothing from there on (its messages expired) is not waited for.
        starts = await self._starts(admin)
        nexts = {tp: first for tp, (first, _) in starts.items()}  # the next offset to handle
        ends = {tp: end for tp, (first, end) in starts.items() if first < end}
        consumer, reader = await self._open(admin, starts)
        producer = self._transport.producer()
        if self._offloader is not None:
            producer = OffloadingProducer(producer, self._offloader)
        checked = time.monotonic()
        try:
            while not self._finished(ends, nexts):
                batch = _Batch(await self._poll(reader, nexts, ends))
                if not batch.messages:
                    if time.monotonic() - checked >= _RECHECK_S:
                        await self._skip_expired(admin, nexts, ends)
                        checked = time.monotonic()
                    continue
                handled = await self._settle(batch, admin, consumer, producer, nexts)
                if progress:
                    progress(handled)
                if handled < len(batch.messages):
                    break
            self.report.unread = sum(max(0, end - nexts[tp]) for tp, end in ends.items())
        finally:
            await reader.close()
            await producer.close()

    async def _open(
        self, admin: Admin, starts: dict[TopicPartition, tuple[int, int]]
    ) -> tuple[Consumer | None, Consumer | Reader]:
        """The redrive's group member (a dry run has none) and what reads the DLQ for it.

        The selection's times are pinned first (:meth:`_pin_times`).
        """
        group = group_name(self._dlq, self._to, self._selection)
        consumer = None if self._dry_run else self._transport.consumer(group, [self._dlq])
        try:
            await self._pin_times(admin, group, consumer, starts)
        except BaseException:
            if consumer is not None:
                await consumer.close()
            raise
        return consumer, consumer or self._transport.reader([self._dlq])

    async def _pin_times(
        self,
        admin: Admin,
        group: str,
        consumer: Consumer | None,
        starts: dict[TopicPartition, tuple[int, int]],
    ) -> None:
        """Select what the redrive set out to move by the times its filters first resolved to.

        An age (``--since 2h``) resolves against the clock of each run, while the group, named
        after the text typed, keeps the position: a run resumed an hour later went on past the
        dead letters of the hour the window had moved off, which the first run had selected,
        as not selected. The first run's times and the ends it read to ride on its commits
        (:class:`_Pin`); a run finding them selects the dead letters below those ends by those
        times, and those after by its own (the same command run again after the redrive was
        done starts a window of its own). A dry run reads them too, by a member that joins
        nothing, and only when the redrive has committed (nothing is left on the broker).

        Each partition holds the pin of the last run that committed on it, so one a stopped run
        had nothing to read on still holds an older, finished pin: the pin resumed is the one
        whose ends some partition has not reached (:func:`_unfinished`), never the first found.
        """
        since, until = self._selection.since_ms, self._selection.until_ms
        if since is None and until is None:
            return
        stored: dict[TopicPartition, Position] = {}
        if consumer is not None:
            stored = await consumer.committed(list(starts))
        elif any(p.committed is not None for p in await admin.group_lag(group, self._dlq)):
            looker = self._transport.consumer(group, [self._dlq])
            try:
                stored = await looker.committed(list(starts))
            finally:
                await looker.close()
        firsts = {tp.partition: first for tp, (first, _) in starts.items()}
        pins = (_Pin.parse(position.metadata) for position in stored.values())
        pin = _unfinished([found for found in pins if found is not None], firsts)
        if pin is None:
            pin = _Pin(since, until, {tp.partition: end for tp, (_, end) in starts.items()})
        self._pin = pin
        self._pinned = replace(self._selection, since_ms=pin.since_ms, until_ms=pin.until_ms)

    async def _skip_expired(
        self, admin: Admin, nexts: dict[TopicPartition, int], ends: dict[TopicPartition, int]
    ) -> None:
        """Move each partition waited for past the messages that expired since the run began.

        Asked only when a poll brought nothing (at most every ``_RECHECK_S``): a partition whose
        messages from its next offset on were trimmed or expired in the meantime delivers
        nothing more below its end, so it is read from its first message still held, or, with
        none left below its end, no longer waited for; nor is one the broker can no longer read
        (set aside, :meth:`_set_aside`).
        """
        starts = await self._starts(admin)
        for tp, end in ends.items():
            if tp.partition in self.report.unreadable:  # set aside: not waited for
                nexts[tp] = max(nexts[tp], end)
            elif tp in starts and nexts[tp] < starts[tp][0]:
                nexts[tp] = min(starts[tp][0], end)

    async def _poll(
        self,
        reader: Consumer | Reader,
        nexts: dict[TopicPartition, int],
        ends: dict[TopicPartition, int],
    ) -> list[Message]:
        """The next messages to handle, each below the end its partition had at start.

        A partition that delivers messages below where this run reads it (the dry run's reader
        starts at the beginning) is moved there, and its messages of this poll dropped.

        Under a rate cap a poll takes a second's worth (one message below 1/s): a batch is
        committed once sent, and one sent slower than Kafka's ``max.poll.interval.ms`` (300 s;
        200 messages at 0.5/s took 400 s) dropped the run from its group, which failed the commit
        and had every run again send the same batch again; a killed run sends its batch again.
        """
        polled = await reader.poll(self._batch, 0.5)
        behind = {m.tp for m in polled if m.offset < nexts.get(m.tp, 0)}
        for tp in behind:
            await reader.seek(tp, nexts[tp])
        return [m for m in polled if m.tp not in behind and m.offset < ends.get(m.tp, 0)]

    def _finished(self, ends: dict[TopicPartition, int], nexts: dict[TopicPartition, int]) -> bool:
        return self._limited() or all(nexts[tp] >= end for tp, end in ends.items())

    def _limited(self) -> bool:
        """Whether the run has taken as many dead letters to move as its limit allows."""
        return self._limit is not None and self._taken >= self._limit

    async def _settle(
        self,
        batch: _Batch,
        admin: Admin,
        consumer: Consumer | None,
        producer: Producer,
        nexts: dict[TopicPartition, int],
    ) -> int:
        """Move ``batch`` and commit how far it got; returns how many messages were handled.

        A stop or failure part way still commits what was settled before it, then propagates.
        """
        try:
            handled = await self._move(batch, admin, producer)
        except BaseException:
            with contextlib.suppress(Exception):  # the stop (or the failure) is what to report
                await self._commit(batch, consumer, nexts)
            raise
        await self._commit(batch, consumer, nexts)
        return handled

    async def _commit(
        self, batch: _Batch, consumer: Consumer | None, nexts: dict[TopicPartition, int]
    ) -> None:
        """Advance each partition past what the batch settled; commit that unless dry (None)."""
        positions = batch.positions()
        nexts.update((p.tp, p.offset) for p in positions)
        if consumer is not None:
            if self._pin is not None:
                positions = [replace(p, metadata=self._pin.text()) for p in positions]
            await consumer.commit(positions)

    async def _move(self, batch: _Batch, admin: Admin, producer: Producer) -> int:
        """Handle the batch in order; returns how many were handled (all unless a limit hit).

        A message with nothing to produce is settled at once, one to produce when the broker
        acknowledged it. Only those to produce count against the limit.
        """
        by_target: dict[str, list[tuple[int, Record]]] = {}
        handled = 0
        for i, message in enumerate(batch.messages):
            if self._limited():
                break
            handled += 1
            target = await self._target(message, admin)
            if target is not None:
                self._taken += 1
            if target is None or self._dry_run:
                batch.settled[i] = True
                if target is not None and _unidentified(redriven(message, self._dlq)):
                    self.report.unidentified += 1
            else:
                by_target.setdefault(target, []).append((i, redriven(message, self._dlq)))
        for target, picked in by_target.items():
            await self._send_paced(producer, target, picked, batch)
        return handled

    async def _takes(self, admin: Admin, topic: str) -> bool:
        """Whether ``topic`` can take redriven messages: it exists and is not the DLQ read."""
        if topic == self._dlq or not _TOPIC_NAME.fullmatch(topic) or topic in {".", ".."}:
            return False
        if topic not in self._topics:
            self._topics[topic] = (await admin.list_topics([topic])).get(topic)
        return self._topics[topic] is not None

    async def _target(self, message: Message, admin: Admin) -> str | None:
        """Count ``message`` in the report; the topic it goes back to, or None if it stays.

        One whose origin header is missing, names the DLQ itself (it would loop) or a topic
        the broker does not have (it would stop the run at every try) stays, counted.
        """
        self.report.scanned += 1
        pinned = self._pin is not None and message.offset < self._pin.ends.get(message.partition, 0)
        if not (self._pinned if pinned else self._selection).matches(message):
            return None
        self.report.selected += 1
        self.report.reasons[reason(message)] += 1
        count = h.int_header(message.headers, h.REDRIVE_COUNT)
        if count >= self._max_redrives:
            self.report.refused_loops += 1
            self._left(
                message,
                f"redriven {count} times already (--max-redrives {self._max_redrives});"
                f" find why it keeps failing (`pipeline tail {self._dlq}`) before a redrive"
                " with a higher --max-redrives",
            )
            return None
        origin = message.headers.get(h.ORIGIN_TOPIC)
        target = self._to or (origin.decode(errors="replace") if origin else None)
        if target is None or not await self._takes(admin, target):
            self.report.no_origin += 1
            if target is None:
                why = f"no {h.ORIGIN_TOPIC} header"
            elif target == self._dlq:
                why = f"its {h.ORIGIN_TOPIC} names the dead-letter topic itself"
            else:
                why = f"its {h.ORIGIN_TOPIC} {_shown(origin or b'')} is no topic the broker has"
            self._left(message, f"{why}; move it with --to <topic> and filters selecting it")
            return None
        return target

    def _left(self, message: Message, why: str) -> None:
        """Say on one line which dead letter stays in the DLQ, why, and what would move it.

        This redrive goes on past it: run again, the same command does not come back to it; a
        new one (other filters) does: ``--key`` and its time (``--since T --until T+1ms``).
        """
        log.warning(
            "%s[%d]@%d (key %s, dead-lettered %s): %s: %s",
            self._dlq,
            message.partition,
            message.offset,
            _shown(message.key),
            utc_time(message.timestamp_ms),
            "would stay in the DLQ"
            if self._dry_run
            else "left in the DLQ, passed over by this redrive",
            why,
        )

    async def _send_paced(
        self, producer: Producer, target: str, picked: list[tuple[int, Record]], batch: _Batch
    ) -> None:
        records = [record for _, record in picked]
        sends = tracing.sends_started(target, records)  # each a child of its dead letter's send
        try:
            await self._send_records(producer, target, picked, batch)
        except BaseException as exc:
            tracing.sends_ended(sends, exc)
            raise
        tracing.sends_ended(sends)

    async def _send_records(
        self, producer: Producer, target: str, picked: list[tuple[int, Record]], batch: _Batch
    ) -> None:
        """Produce in order, in chunks (:meth:`_chunks`), or one at a time spaced to the rate cap.

        Each message of ``batch`` is settled as the broker acknowledges its record. A record
        the target refuses as too large stays in the DLQ, settled and named (one line): a chunk
        refused so is sent again one record at a time, so the others still go. A chunk is so
        refused whole, before any of it is sent, when a record is above what this process's
        producer takes; the broker refuses a chunk :meth:`_chunks` kept within the topic's
        ``max.message.bytes`` only if that was lowered after this run read it (read again for
        the next batch), and then what it took of the chunk's other partitions goes twice.
        """
        for chunk in self._chunks(target, picked):
            started = time.monotonic()
            try:
                await self._send_chunk(producer, target, chunk, batch)
            except MessageTooLarge as exc:
                if len(chunk) == 1:
                    self._too_large(chunk, target, batch, exc)
                else:
                    self._topics.pop(target, None)  # its limit is read again for the next batch
                    for one in chunk:
                        try:
                            await self._send_chunk(producer, target, [one], batch)
                        except MessageTooLarge as alone:
                            self._too_large([one], target, batch, alone)
            if self._interval_s:
                await asyncio.sleep(max(0.0, self._interval_s - (time.monotonic() - started)))

    def _chunks(
        self, target: str, picked: list[tuple[int, Record]]
    ) -> list[list[tuple[int, Record]]]:
        """``picked`` in order as the sends to make: one record each under a rate cap, else few.

        Without a cap, on a target with a ``max.message.bytes`` (Kafka), each partition's share
        of a send stays within it: librdkafka batches a send's records of one partition
        together, and the broker refuses a batch larger than that whole, after taking those of
        the other partitions, so the chunk was sent again and what was taken was written twice
        (three 1,500-byte records of one key under 3,000 bytes). A share counts
        each record with the most its framing takes (:func:`_framed`) and keeps
        :data:`_ROOM_BYTES` for the batch's own; a record without a key (placed at random)
        counts against every partition. A record over that by itself goes alone, so that the
        refusal does not take the records around it down with it.
        """
        if self._interval_s:
            return [[one] for one in picked]
        info = self._topics.get(target)
        limit = info.max_message_bytes if info is not None else None
        partitions = info.partitions if info is not None else 0
        if limit is None or partitions < 1:
            return [picked] if picked else []
        room = limit - _ROOM_BYTES
        chunks: list[list[tuple[int, Record]]] = []
        run: list[tuple[int, Record]] = []
        shares: Counter[int] = Counter()  # bytes of ``run`` per partition
        anywhere = 0  # bytes of ``run`` without a key
        for one in picked:
            size = _framed(one[1])
            if size > room:
                chunks += [run, [one]] if run else [[one]]
                run, shares, anywhere = [], Counter(), 0
                continue
            where = _placed(one[1], partitions)
            share = max(shares.values(), default=0) if where is None else shares[where]
            if anywhere + share + size > room:
                chunks.append(run)
                run, shares, anywhere = [], Counter(), 0
            run.append(one)
            if where is None:
                anywhere += size
            else:
                shares[where] += size
        return [*chunks, run] if run else chunks

    async def _send_chunk(
        self, producer: Producer, target: str, chunk: list[tuple[int, Record]], batch: _Batch
    ) -> None:
        """Produce ``chunk`` and settle its messages once the broker took all of it.

        A stop that comes while records are on their way waits for the broker's answer first:
        records it took are settled (and so committed) before the stop propagates, not sent
        again next run.
        """
        records = [record for _, record in chunk]
        sending: asyncio.Future[list[Delivered]] = asyncio.ensure_future(
            producer.send_many(target, records)
        )
        try:
            await asyncio.shield(sending)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):  # a failed send settles nothing
                await sending
            if sending.done() and not sending.cancelled() and sending.exception() is None:
                self._settled(chunk, target, batch)
            raise
        self._settled(chunk, target, batch)

    def _too_large(
        self, chunk: list[tuple[int, Record]], target: str, batch: _Batch, exc: MessageTooLarge
    ) -> None:
        """Settle the one message of ``chunk``, refused by ``target`` as too large, as left."""
        ((i, record),) = chunk
        batch.settled[i] = True
        self.report.too_large += 1
        self._left(
            batch.messages[i],
            f"{target} refused its {record.size} bytes as too large ({exc}); raise"
            " PIPELINE_MAX_MESSAGE_BYTES (Kafka: and the topic's max.message.bytes), then move"
            " it with filters selecting it",
        )

    def _settled(self, chunk: list[tuple[int, Record]], target: str, batch: _Batch) -> None:
        """Mark the messages of ``chunk``, whose records the broker took, settled and moved."""
        for i, _ in chunk:
            batch.settled[i] = True
        self.report.moved += len(chunk)
        self.report.unidentified += sum(1 for _, record in chunk if _unidentified(record))
        self.report.moved_to[target] += len(chunk)


def _unidentified(record: Record) -> bool:
    """Whether ``record`` goes back without an event id (``ctx.once`` sees a new event)."""
    return not (record.headers or {}).get(h.EVENT_ID)


def _framed(record: Record) -> int:
    """The most bytes ``record`` takes in a Kafka batch: its size and its framing."""
    return record.size + _RECORD_FRAMING + _HEADER_FRAMING * len(record.headers or ())


def _placed(record: Record, partitions: int) -> int | None:
    """The partition ``record`` goes to among ``partitions``, or None if placed at random."""
    if record.partition is not None:
        return record.partition
    return None if record.key is None else partition_for(record.key, partitions)


def _unfinished(pins: Sequence[_Pin], firsts: dict[int, int]) -> _Pin | None:
    """The pin of the redrive still under way: the one with an end some partition is short of.

    ``firsts`` is where each partition is read from now. A position only moves forward and a
    partition's end only grows, so a pin every partition has reached stays reached, and a run
    begins a new pin only when none is left unreached: at most one is unreached, whichever
    partitions each run committed on (a partition a run had nothing to read on keeps the pin
    of the run before). Two could be only if two runs of the same command began at once, each
    committing its own; then the one begun last (the higher ends, then the later times).
    """
    unreached = [
        pin for pin in pins if any(first < pin.ends.get(p, 0) for p, first in firsts.items())
    ]
    return max(
        unreached,
        key=lambda pin: (sum(pin.ends.values()), pin.since_ms or 0, pin.until_ms or 0),
        default=None,
    )


def _shown(raw: bytes | None) -> str:
    """``raw`` for a log line: its repr, cut at :data:`_SHOWN_CHARS` characters."""
    text = repr(raw[:_SHOWN_CHARS] if raw is not None else raw)
    return text if len(text) <= _SHOWN_CHARS else f"{text[: _SHOWN_CHARS - 3]}..."
