"""Throttled lanes in a member: a message waits for its slots without holding a worker.

A message of a lane with a ``throttle:`` policy enters a :class:`ThrottleGate` before the key
lanes. Per key (in its partition) the gate keeps a FIFO; only the head of each key asks the
:class:`Admitter` (the Redis throttle) for its slots, so a waiting message blocks only its own
key (per-key order holds) and waits as a pending future, not in a worker. Once granted, the head
goes to the key lanes with its permit; when it finishes, the permit is released and the key's
next message asks.

Redis sees a flood as a bounded trickle: a member keeps at most :data:`ASKING_AT_ONCE` heads
asking for one set of throttle keys at a time (per lane). A flood of one tenant over thousands of
keys would otherwise put thousands of acquisitions in one write to Redis, and another tenant's
acquisition made in the same instant would wait behind all of them there (Redis runs one
connection's calls in order). The others wait in the member, in arrival order, and ask as the
earlier ones are granted: Redis would grant them in that order anyway (FIFO within a priority).

Memory stays bounded: beyond a lane's ``max_waiting`` messages waiting in the gate, an
over-limit message of that lane whose tenant waits at least its share of the lane's waiting
messages, and whose key has nothing else in this member, is *deferred* (the member sends it
through the first retry tier and parks its key behind it) instead of being held. Messages of a
key that already waits stay in its FIFO (the partition's high-water mark bounds them), so
deferral never lets a message overtake an earlier one of its key.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import string
from collections import Counter, deque
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from typing import Any, Generic, NamedTuple, Protocol

from pipeline import headers as h
from pipeline.admission.adaptive import Feedback
from pipeline.cancel_tasks import cancel_until_done
from pipeline.envelope import TopicPartition
from pipeline.runtime.work import Item, T
from pipeline.topics.spec import ThrottlePolicy

log = logging.getLogger(__name__)

GateKey = tuple[TopicPartition, Hashable]
AskGroup = tuple[str, tuple[str, ...]]
"""A lane and the throttle keys of a message: heads of one group ask at most so many at once."""

SPILL_MIN_WAITING = 2
"""Messages a key has waiting for it to be sent away from a partition paused full."""

ASKING_AT_ONCE = 32
"""Acquisitions of one lane's set of throttle keys a member has in Redis at once (waiting or
on their way); more heads of that set wait in the member, in order, until one is granted."""


class Admitter(Protocol):
    """Grants slots on throttle keys (:class:`pipeline.admission.throttle.Throttle`)."""

    async def acquire(
        self, keys: Sequence[str], *, priority: int = 0, lease_ms: int | None = None
    ) -> Any:
        """Wait until the job holds a slot on every key; return its permit."""
        ...

    async def release(self, permit: Any, feedback: Sequence[Feedback] = ()) -> None:
        """Free the permit's slots (handing them to the next waiters), with adaptive feedback."""
        ...


class _Fields(dict[str, str]):
    """Template values; a missing one raises KeyError, which leaves that key out."""


@functools.lru_cache(maxsize=256)
def _separators(template: str) -> frozenset[str]:
    """What a value must not carry as itself into ``template``'s keys (empty: anything may).

    A template of two fields or more joins them with its own text (``sub:{tenant}/{customer_id}``),
    so a value holding the text between them could give two messages one key (tenant ``a/b``
    with customer ``c``, tenant ``a`` with customer ``b/c``): those characters and ``%`` are
    written percent-encoded (UTF-8). One field alone cannot collide (the text around it is
    fixed), so its values stay as they are.
    """
    fields = [(text, field) for text, field, _, _ in string.Formatter().parse(template)]
    between = "".join(text for text, field in fields[1:] if field is not None)
    return frozenset("%" + between) if between else frozenset()


def _escaped(value: str, separators: frozenset[str]) -> str:
    if not separators.intersection(value):
        return value
    return "".join(
        "".join(f"%{b:02X}" for b in c.encode(errors="surrogatepass")) if c in separators else c
        for c in value
    )


def _fill(template: str, values: _Fields) -> str:
    separators = _separators(template)
    if not separators:
        return template.format_map(values)
    escaped = _Fields({name: _escaped(value, separators) for name, value in values.items()})
    return template.format_map(escaped)


def throttle_keys(policy: ThrottlePolicy, lane: str, message: Item) -> list[str]:
    """The throttle keys ``message`` needs, from the policy's templates.

    A template naming a field none of the key, the lane and ``pl-tenant`` fill reads the body;
    a body that is no JSON object (not JSON, or nested too deep for ``json`` to read) fills
    none, and a template it leaves unfilled gives no key.
    """
    values = _Fields(lane=lane)
    if message.key is not None:
        values["key"] = message.key.decode(errors="replace")
    tenant = message.headers.get(h.TENANT)
    if tenant is not None:
        values["tenant"] = tenant.decode(errors="replace")
    document: Any = None
    out: list[str] = []
    for template in policy.keys:
        try:
            out.append(_fill(template, values))
            continue
        except KeyError:
            pass
        if document is None:
            try:
                document = json.loads(message.value)
            except (ValueError, RecursionError):  # RecursionError: nested too deep
                document = {}
            if isinstance(document, dict):
                for name, value in document.items():
                    if isinstance(value, str | int) and name not in values:
                        values[name] = str(value)
        with contextlib.suppress(KeyError):
            out.append(_fill(template, values))
    return out


class _Waiting(NamedTuple, Generic[T]):
    """A message in the gate, with what its admission needs."""

    message: T
    keys: list[str]
    policy: ThrottlePolicy
    lane: str
    can_spill: bool


def _group(waiting: _Waiting[Any]) -> AskGroup:
    return waiting.lane, tuple(waiting.keys)


def tenant_of(message: Item) -> str:
    """The message's ``pl-tenant`` header as text (empty without one)."""
    raw = message.headers.get(h.TENANT)
    return raw.decode(errors="replace") if raw is not None else ""


class ThrottleGate(Generic[T]):
    """Per-key FIFOs in front of the key lanes; each key's head waits for its slots."""

    def __init__(
        self,
        admitter: Admitter,
        admitted: Callable[[T], None],
        deferred: Callable[[T], None],
    ) -> None:
        """``admitted(message)`` runs it (it holds its permit); ``deferred`` sends it away."""
        self._admitter = admitter
        self._admitted = admitted
        self._deferred = deferred
        self._queues: dict[GateKey, deque[_Waiting[T]]] = {}
        self._acquiring: dict[GateKey, asyncio.Task[None]] = {}
        self._asking: Counter[AskGroup] = Counter()  # acquisitions under way per group
        self._held_back: dict[AskGroup, deque[GateKey]] = {}  # heads waiting to ask, in order
        self._held_keys: set[GateKey] = set()  # the keys of _held_back (an entry not here is gone)
        self._closing = False
        self._active: set[GateKey] = set()  # keys asking for or holding slots
        self._permits: dict[tuple[TopicPartition, int], tuple[GateKey, Any]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self.waiting = 0
        self.waiting_by: Counter[tuple[str, str]] = Counter()
        """Messages waiting for admission per (lane, tenant), for metrics and status."""
        self._waiting_lane: Counter[str] = Counter()
        """Messages waiting for admission per lane: what its ``max_waiting`` bounds."""
        self._granted: Counter[str] = Counter()
        self._failed_open: Counter[str] = Counter()
        self.deferrals = 0

    def offer(
        self,
        message: T,
        policy: ThrottlePolicy,
        lane: str,
        *,
        ordered: bool,
        busy: bool,
        can_defer: bool,
        can_spill: bool = False,
    ) -> None:
        """Queue ``message`` for admission.

        Args:
            message: the message.
            policy: its lane's throttle policy.
            lane: its lane's name.
            ordered: whether the lane keeps per-key order.
            busy: its key has work in the key lanes (it must not be deferred past it).
            can_defer: the lane has a retry tier to defer through.
            can_spill: it may be sent away with its key when its partition pauses full
                (:meth:`spill`): it may be deferred, and its key is parked behind the first
                (the lane keeps per-key order across retries, in Redis).
        """
        keys = throttle_keys(policy, lane, message)
        if not keys:
            self._admitted(message)
            return
        key: GateKey = (message.tp, message.key if ordered else ("offset", message.offset))
        queue = self._queues.get(key)
        if queue is None:
            if can_defer and not busy and self._over_share(message, lane, policy):
                self.deferrals += 1
                self._deferred(message)
                return
            queue = self._queues[key] = deque()
        queue.append(_Waiting(message, keys, policy, lane, can_spill))
        self.waiting += 1
        self.waiting_by[lane, tenant_of(message)] += 1
        self._waiting_lane[lane] += 1
        if key not in self._active:
            self._ask(key)

    def spill(self, tp: TopicPartition, count: int) -> list[T]:
        """Send about ``count`` of ``tp``'s waiting messages away: the partition paused full.

        Held here, a flood on a few keys keeps its partition paused, and every other tenant's
        messages behind it there unread, until those keys have run through their backlog one
        message at a time (seconds to minutes). So the keys of the tenant with the most
        messages waiting in ``tp`` that may go (copies back from a tier do not count) go, the
        longest first, each key whole, and only a key with :data:`SPILL_MIN_WAITING` messages
        waiting or more (one alone is the over-share deferral's, see :meth:`offer`) every one
        of which may be spilled (``can_spill``: its lane has a retry tier and parks its keys in
        Redis; none is a copy back from a tier, which would go round again). Where nothing
        parks, the key's messages would each go through the tier on their own, its later
        messages running before them. They go to the key lanes as deferrals, in order, behind
        whatever of their key runs there: the first parks its key through the first retry
        tier, the others are held behind it in Redis by the run guard (their offsets done) and
        released in order once it ran. Returns those that went.
        """
        mine: Counter[str] = Counter()  # what each tenant has waiting that may go
        for key, queue in self._queues.items():
            if key[0] == tp:
                for waiting in queue:
                    if waiting.can_spill:
                        mine[tenant_of(waiting.message)] += 1
        if not mine:
            return []
        tenant = mine.most_common(1)[0][0]
        candidates = sorted(
            (
                key
                for key, queue in self._queues.items()
                if key[0] == tp
                and len(queue) >= SPILL_MIN_WAITING
                and tenant_of(queue[0].message) == tenant
                and all(waiting.can_spill for waiting in queue)
            ),
            key=lambda key: len(self._queues[key]),
            reverse=True,
        )
        spilled: list[T] = []
        for key in candidates:
            if len(spilled) >= count:
                break
            spilled += self._spill_key(key)
        if spilled:
            self.deferrals += len(spilled)
            log.debug(
                "%s full: %d waiting message(s) of tenant %r deferred", tp, len(spilled), tenant
            )
        return spilled

    def _spill_key(self, key: GateKey) -> list[T]:
        """Defer every message ``key`` has waiting, in order; its acquisition is withdrawn."""
        queue = self._queues.pop(key)
        self._held_keys.discard(key)
        task = self._acquiring.pop(key, None)
        if task is not None:  # its head was asking: nothing of the key holds a permit
            task.cancel()
            self._active.discard(key)
        elif not any(held[0] == key for held in self._permits.values()):
            self._active.discard(key)  # held back from asking
        for waiting in queue:
            self._forget_waiting(waiting)
            self._deferred(waiting.message)
        return [waiting.message for waiting in queue]

    def _over_share(self, message: T, lane: str, policy: ThrottlePolicy) -> bool:
        """``lane`` has its ``max_waiting`` waiting, and this message's tenant its share of them.

        Deferring only the tenants that wait most keeps a flood's overflow in the delay tier
        while the other tenants' messages still wait here, in memory and in order. Each lane
        counts its own: another lane's flood neither defers this lane's messages nor, by adding
        to the total, keeps this lane's flood from being deferred.
        """
        waiting = self._waiting_lane[lane]
        if waiting < policy.max_waiting:
            return False
        mine = self.waiting_by.get((lane, tenant_of(message)), 0)
        tenants = sum(1 for (name, _), count in self.waiting_by.items() if name == lane and count)
        return mine * max(tenants, 1) >= waiting

    def _ask(self, key: GateKey) -> None:
        """Let ``key``'s head ask for its slots, now or once its group has room."""
        self._active.add(key)
        group = _group(self._queues[key][0])
        if self._asking[group] >= ASKING_AT_ONCE:
            self._held_back.setdefault(group, deque()).append(key)
            self._held_keys.add(key)
            return
        self._start(key, group)

    def _start(self, key: GateKey, group: AskGroup) -> None:
        """``key``'s head asks; its group's room comes back however the acquisition ends.

        Given back when the task is done, not in the task: one withdrawn before it ran a step
        (a revocation or a spill in the turn it started) never runs its own code.
        """
        self._asking[group] += 1
        waiting = self._queues[key][0]
        task = asyncio.create_task(self._acquire(key, waiting))
        task.add_done_callback(lambda _: self._asked(group))
        self._acquiring[key] = task

    def _asked(self, group: AskGroup) -> None:
        """An acquisition of ``group`` ended: the next head held back in it asks."""
        self._asking[group] -= 1
        if self._asking[group] <= 0:
            del self._asking[group]
        held = self._held_back.get(group)
        while held and not self._closing and self._asking[group] < ASKING_AT_ONCE:
            key = held.popleft()
            if key in self._held_keys:  # else dropped with its partition meanwhile
                self._held_keys.discard(key)
                self._start(key, group)
        if held is not None and not held:
            del self._held_back[group]

    async def _acquire(self, key: GateKey, waiting: _Waiting[T]) -> None:
        message, keys, policy = waiting.message, waiting.keys, waiting.policy
        try:
            permit = await self._admitter.acquire(
                keys, priority=policy.priority, lease_ms=policy.lease_ms
            )
        except Exception:  # the throttle failed unexpectedly: admit rather than strand the key
            log.exception("admission of %s@%d failed; running it", message.tp, message.offset)
            permit = None
        if permit is None or getattr(permit, "unconditional", False):
            self._failed_open[waiting.lane] += 1
        else:
            self._granted[waiting.lane] += 1
        self._acquiring.pop(key, None)
        queue = self._queues.get(key)
        if queue is None or queue[0] is not waiting:  # revoked while it waited
            self._active.discard(key)
            self._release(permit)
            return
        queue.popleft()
        self._forget_waiting(waiting)
        if not queue:
            del self._queues[key]
        self._permits[message.tp, message.offset] = (key, permit)
        self._admitted(message)

    def take_counts(self) -> tuple[Counter[str], Counter[str]]:
        """Admissions per lane since the last call: granted, and let through failing open."""
        counts = (self._granted, self._failed_open)
        self._granted, self._failed_open = Counter(), Counter()
        return counts

    def _forget_waiting(self, waiting: _Waiting[T]) -> None:
        self.waiting -= 1
        self._waiting_lane[waiting.lane] -= 1
        counted = (waiting.lane, tenant_of(waiting.message))
        self.waiting_by[counted] -= 1
        if self.waiting_by[counted] <= 0:
            del self.waiting_by[counted]

    def _release(self, permit: Any, feedback: Sequence[Feedback] = ()) -> None:
        if permit is None:
            return
        task = asyncio.create_task(self._admitter.release(permit, feedback))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def released(self) -> None:
        """Wait until the releases already started have reached the throttle."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    def held_keys(self, message: Item) -> tuple[str, ...]:
        """The throttle keys ``message`` holds slots on (none if it holds no permit)."""
        held = self._permits.get((message.tp, message.offset))
        keys = getattr(held[1], "keys", ()) if held is not None else ()
        return tuple(keys)

    def finished(self, message: Item, feedback: Sequence[Feedback] = ()) -> None:
        """``message`` is done: release its slots and let its key's next message ask."""
        held = self._permits.pop((message.tp, message.offset), None)
        if held is None:
            return
        key, permit = held
        self._release(permit, feedback)
        self._active.discard(key)
        if key in self._queues:
            self._ask(key)

    def drop(
        self,
        partitions: Iterable[TopicPartition],
        running: Collection[tuple[TopicPartition, int]] = (),
    ) -> None:
        """Forget waiting messages of revoked partitions (their acquisitions are withdrawn).

        The slots of admitted messages that will not run are released. Those of ``running``
        ((partition, offset) of messages still running) stay held, and renewed, until each
        run ends (:meth:`finished`): the tenant's limit still counts the run, as it does any
        other. Its key stays active until then: the partition assigned back, the same offset
        read again asks only once the run has ended, so it never takes the permit of that
        partition and offset while the run holds it (the run's end would release the copy's
        slots, and its own would stay live, renewed for the process's life).
        """
        wanted = set(partitions)
        keep = set(running)
        holding = {self._permits[i][0] for i in keep if i in self._permits}
        for key in [k for k in self._queues if k[0] in wanted]:
            self._held_keys.discard(key)
            for entry in self._queues.pop(key):
                self._forget_waiting(entry)
            if key not in holding:
                self._active.discard(key)
            task = self._acquiring.pop(key, None)
            if task is not None:
                task.cancel()
        for ident in [i for i in self._permits if i[0] in wanted and i not in keep]:
            key, permit = self._permits.pop(ident)
            self._active.discard(key)
            self._release(permit)

    async def close(self) -> None:
        """Withdraw every waiting acquisition and wait for pending releases."""
        self._closing = True  # a withdrawn acquisition lets no held-back head ask
        self._held_back.clear()
        self._held_keys.clear()
        await cancel_until_done(*self._acquiring.values())
        self._acquiring.clear()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
