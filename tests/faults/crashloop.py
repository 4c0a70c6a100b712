"""The crash-loop scenario: members killed (-9) over and over while an ordered lane retries.

:func:`run_crashloop` starts a :class:`~faults.cluster.Cluster` of members only (no ingress: the
events are produced straight to the lane, so thousands fit in a short run), produces the
events at a steady pace and, meanwhile, kills one member with ``kill -9`` every few seconds
(seeded), the supervisor starting its replacement at once. Once every event is applied or
dead-lettered and the group has committed everything on the lane and its retry tiers, it
counts:

* ``lost``: events neither applied nor in the DLQ (the side effect is keyed by the event id at
  the receiving end, so applied means applied once);
* ``order_violations``: per key, a first success that comes after a later event's;
* ``overlaps``: handler runs that entered while another run of the same key had not left;
* ``last_run_order_violations`` (reported, not failed): per key, events whose last run that
  reached the side effect came after the last run of a later event: what an effect that does
  not deduplicate (last writer wins) would be left holding out of order. A replay after a kill
  runs the uncommitted range again in order and adds none; a finished message run again
  behind a later one (m1, m2, m1) adds one.

With ``freezes`` instead of kills, members are stopped (SIGSTOP) for ``freeze_s``, longer
than their sessions, leases and liveness, and then resumed: alive, but taken for dead while
frozen. A run that was in its handler when its process froze and is still there when another
run of its key enters meanwhile is an overlap no lease can prevent (its process cannot be
told); those are counted apart (``overlaps_in_flight_when_frozen``), not failed. Every other
overlap, in particular any run a resumed process *starts* beside the key's new owner, fails.

Overlaps are read from one counter in Redis (``spans.lua``): each run's entry and exit take
its next value, and so does each kill, once just before the signal and once after the process
was reaped. A run that never left ran at least until the kill of its process was sent and at
most until it was reaped. So a run entering after another run of its key entered and before
that one left (or, if it never left, before its kill was sent) is an overlap for certain; one
entering between the kill being sent and the process reaped is counted ``uncertain`` and
reported, not failed; later entries are not overlaps. Runs of a member that exited without
being killed (a crash) have no known end: entries after them are uncertain too.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import math
import random
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from faults.cluster import Cluster
from faults.runner import DEAD_REASONS, Event, Observer

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.transport import create_transport

Kills = dict[int, tuple[int, int]]  # pid -> the clock just before the kill, and once reaped
RETRY: dict[str, object] = {"tiers": ["1s", "3s"]}
APP = "faults.crashloop_app:app"


@dataclass(frozen=True)
class CrashLoop:
    """What the scenario produces and how hard it kills."""

    events: int = 5_000
    keys: int = 200
    flaky_per_mille: int = 20  # events whose first run fails, chosen by a hash of their id
    produce_s: float = 30.0
    kills: int = 12
    kill_every_s: tuple[float, float] = (3.0, 5.0)
    freezes: int = 0
    freeze_s: float = 0.0
    seed: int = 31
    deadline_s: float = 90.0


def crashloop_events(loop: CrashLoop) -> list[Event]:
    """The events, round-robin over the keys; a hash of the id picks the flaky ones."""
    out = []
    for seq in range(loop.events):
        digest = hashlib.sha256(f"evt-{seq}".encode()).digest()
        flaky = int.from_bytes(digest[:4], "big") % 1000 < loop.flaky_per_mille
        out.append(Event(seq, f"k{seq % loop.keys}", "flaky" if flaky else "ok"))
    return out


@dataclass(frozen=True)
class Span:
    """One handler run: its token (``pid.nonce.n``), key, event, attempt, copy and entry."""

    token: str
    key: str
    event: str
    attempt: int
    where: str
    enter: int

    @property
    def pid(self) -> int:
        """The member's process id."""
        return int(self.token.split(".", 1)[0])


@dataclass
class Ends:
    """When runs ended, on the scenario's clock: certainly not before, certainly before."""

    left: dict[str, int]
    killed: Kills
    alive: set[int]
    frozen: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """pid -> the clock just before each SIGSTOP and just after its SIGCONT."""

    def frozen_in_flight(self, run: Span, later: Span) -> bool:
        """Whether ``run`` was in its handler when its process froze, before ``later`` entered."""
        return any(
            run.enter < stopped <= later.enter for stopped, _ in self.frozen.get(run.pid, ())
        )

    def bounds(self, span: Span) -> tuple[float, float]:
        """(still running until at least, done by at most) for ``span``."""
        if span.token in self.left:
            end = self.left[span.token]
            return end, end
        if span.pid in self.killed:
            sent, reaped = self.killed[span.pid]
            return sent, reaped
        if span.pid in self.alive:
            return math.inf, math.inf  # still running at the end
        return span.enter, math.inf  # its member exited on its own: the end is unknown


@dataclass
class Overlaps:
    """Entries that found their key running, certain and uncertain, with a few examples."""

    certain: int = 0
    uncertain: int = 0
    in_flight_when_frozen: int = 0
    same_member: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    """The keys of the certain overlaps, first found first."""


def _kind(running: Span, finished: dict[str, int]) -> str:
    """What the run that was found running is: a rerun of a finished event, or a first run."""
    tier = ".retry." in running.where
    if finished.get(running.event, running.enter) < running.enter:
        return "stale copy from a retry tier" if tier else "finished message run again"
    return "retried message" if tier else "first run"


def _found_running(later: Span, earlier: list[Span], ends: Ends) -> tuple[Span | None, bool]:
    """A run of ``earlier`` certainly running when ``later`` entered; else whether one may be."""
    maybe = False
    for run in earlier:
        running_until, done_by = ends.bounds(run)
        if running_until > later.enter:
            return run, False
        maybe = maybe or done_by > later.enter
    return None, maybe


def find_overlaps(spans: Iterable[Span], ends: Ends) -> Overlaps:
    """Count runs that entered while another run of their key was still running."""
    by_key: dict[str, list[Span]] = defaultdict(list)
    finished: dict[str, int] = {}  # event -> when its first run to leave the handler left
    for span in spans:
        by_key[span.key].append(span)
        if span.token in ends.left:
            left = ends.left[span.token]
            finished[span.event] = min(finished.get(span.event, left), left)
    found = Overlaps()
    for runs in by_key.values():
        runs.sort(key=lambda s: s.enter)
        for index, later in enumerate(runs):
            running, maybe = _found_running(later, runs[:index], ends)
            if running is None:
                found.uncertain += maybe
                continue
            if ends.frozen_in_flight(running, later):
                found.in_flight_when_frozen += 1
                continue
            found.certain += 1
            found.same_member += running.pid == later.pid
            kind = _kind(running, finished)
            found.kinds[kind] += 1
            if later.key not in found.keys:
                found.keys.append(later.key)
            if len(found.examples) < 10:
                found.examples.append(
                    f"{later.key}: {later.event} (attempt {later.attempt}, {later.where}, "
                    f"pid {later.pid}) entered while {running.event} (attempt "
                    f"{running.attempt}, {running.where}, pid {running.pid}; {kind}) ran"
                )
    return found


def order_violations(order: dict[str, list[tuple[int, int, int]]]) -> int:
    """Per key, first successes whose event was produced before one applied earlier."""
    count = 0
    for entries in order.values():
        highest = -1
        for seq, _, _ in entries:
            if seq < highest:
                count += 1
            highest = max(highest, seq)
    return count


def last_run_order_violations(reached: dict[str, list[int]]) -> int:
    """Per key, events ordered by their last run that reached the effect: each one out of order.

    ``m1, m2, m1'`` leaves m1 last although m2 is later: one. ``m1, m2, m1', m2'`` (a replay in
    order) leaves none.
    """
    count = 0
    for seqs in reached.values():
        last = {seq: i for i, seq in enumerate(seqs)}
        highest = -1
        for seq in sorted(last, key=last.__getitem__):
            if seq < highest:
                count += 1
            highest = max(highest, seq)
    return count


def order_examples(
    order: dict[str, list[tuple[int, int, int]]], spans: list[Span], ends: Ends, limit: int = 3
) -> list[str]:
    """Lines showing up to ``limit`` keys whose effects ran out of order.

    Per key: the order its effects ran in (``seq@partition:offset``), and every handler run of
    that key (entry..end at most, token, event, attempt, copy).
    """
    lines: list[str] = []
    for key, entries in sorted(order.items()):
        seqs = [seq for seq, _, _ in entries]
        if all(a <= b for a, b in itertools.pairwise(seqs)):
            continue
        if len(lines) // 2 >= limit:
            break
        applied = " ".join(f"{seq}@{part}:{off}" for seq, part, off in entries)
        runs = "; ".join(
            f"{s.enter}..{ends.bounds(s)[1]} {s.token} {s.event} a{s.attempt} {s.where}"
            for s in sorted(spans, key=lambda s: s.enter)
            if s.key == key
        )
        lines += [f"key {key} applied: {applied}", f"key {key} runs: {runs}"]
    return lines


async def _produce(cluster: Cluster, events: list[Event], produce_s: float) -> None:
    """Produce ``events`` to the lane in order, in small batches spread over ``produce_s``."""
    transport = create_transport(cluster.settings)
    producer = transport.producer()
    batch = 50
    started = time.monotonic()
    try:
        for first in range(0, len(events), batch):
            delay = started + produce_s * first / len(events) - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing of the offered load
            records = [
                Record(
                    e.body(),
                    key=e.key.encode(),
                    headers={h.EVENT_ID: e.id.encode(), h.TENANT: b"t1"},
                )
                for e in events[first : first + batch]
            ]
            await producer.send_many(cluster.lane, records)
    finally:
        await producer.close()
        await transport.close()


async def _fault_loop(cluster: Cluster, observer: Observer, loop: CrashLoop) -> list[int]:
    """Kill (-9) or freeze a seeded member every few seconds, as ``loop`` says.

    Each fault is stamped on the scenario's clock just before it starts and once it is over
    (the process reaped and replaced, or resumed).
    """
    rng = random.Random(loop.seed)
    clock = f"{cluster.prefix}:clock"
    freezing = loop.freezes > 0
    victims = []
    for n in range(loop.freezes if freezing else loop.kills):
        await asyncio.sleep(rng.uniform(*loop.kill_every_s))  # the fault's cadence
        slot = rng.randrange(cluster.member_count)
        victim = cluster.members[slot]
        assert victim is not None
        before = int(await observer.redis.incr(clock))
        if freezing:
            await cluster.freeze_member(slot, loop.freeze_s)
        else:
            await cluster.kill_member(slot)
        after = int(await observer.redis.incr(clock))
        name, field = ("frozen", f"{victim.pid}:{n}") if freezing else ("killed", str(victim.pid))
        await observer.redis.hset(f"{cluster.prefix}:{name}", field, f"{before}:{after}")
        victims.append(victim.pid)
    return victims


async def _lagging(cluster: Cluster, topics: list[str]) -> dict[str, int]:
    """The partitions of ``topics`` (``topic[p]``) the group has not committed to their end."""
    transport = create_transport(cluster.settings)
    admin = transport.admin()
    try:
        return {
            f"{topic}[{p.tp.partition}]": p.lag
            for topic in topics
            for p in await admin.group_lag(cluster.group, topic)
            if p.lag
        }
    finally:
        await admin.close()
        await transport.close()


async def _tier_entries(cluster: Cluster) -> dict[str, int]:
    """Messages written to each retry tier of the lane."""
    transport = create_transport(cluster.settings)
    admin = transport.admin()
    try:
        names = cluster.spec.retry_topic_names()
        infos = await admin.list_topics(names)
        return {name.rsplit(".", 1)[-1]: infos[name].message_count for name in names}
    finally:
        await admin.close()
        await transport.close()


async def _frozen(observer: Observer) -> dict[int, list[tuple[int, int]]]:
    frozen: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for which, stamps in (
        await observer.redis.hgetall(f"{observer.cluster.prefix}:frozen")
    ).items():
        stopped, resumed = stamps.decode().split(":")
        frozen[int(which.decode().split(":")[0])].append((int(stopped), int(resumed)))
    return dict(frozen)


async def _spans(observer: Observer) -> tuple[list[Span], dict[str, int], Kills]:
    prefix = observer.cluster.prefix
    spans = []
    for raw in await observer.redis.lrange(f"{prefix}:spans", 0, -1):
        token, key, event, attempt, where, enter = raw.decode().split(" ")
        spans.append(Span(token, key, event, int(attempt), where, int(enter)))
    left = {k.decode(): int(v) for k, v in (await observer.redis.hgetall(f"{prefix}:left")).items()}
    killed: Kills = {}
    for pid, stamps in (await observer.redis.hgetall(f"{prefix}:killed")).items():
        sent, reaped = stamps.decode().split(":")
        killed[int(pid)] = (int(sent), int(reaped))
    return spans, left, killed


def _keep(cluster: Cluster, spans: list[Span], ends: Ends) -> None:
    """Write every run with its bounds, and the kills, to ``spans.txt`` in the scenario's directory.

    One line per run: entry, running until at least, done by at most, token, key, event,
    attempt, copy (``topic:partition:offset``); then ``kill PID sent N reaped M`` and
    ``freeze PID stopped N resumed M``, and ``log NAME pid PID`` for each process's log.
    """
    lines = [
        f"{s.enter} {ends.bounds(s)[0]} {ends.bounds(s)[1]} {s.token} {s.key} {s.event} "
        f"{s.attempt} {s.where}"
        for s in sorted(spans, key=lambda s: (s.key, s.enter))
    ]
    lines += [
        f"kill {pid} sent {sent} reaped {reaped}" for pid, (sent, reaped) in ends.killed.items()
    ]
    lines += [
        f"freeze {pid} stopped {stopped} resumed {resumed}"
        for pid, windows in ends.frozen.items()
        for stopped, resumed in windows
    ]
    lines += [f"log {name} pid {pid}" for pid, name in cluster.log_names().items()]
    (cluster.directory / "spans.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


async def run_crashloop(cluster: Cluster, loop: CrashLoop) -> dict[str, object]:
    """Run the crash loop on ``cluster`` and return its counters (see the module docstring)."""
    events = crashloop_events(loop)
    ids = {e.id for e in events}
    began = time.monotonic()
    await cluster.start(ingress=False)
    observer = Observer(cluster)
    topics = [cluster.lane, *cluster.spec.retry_topic_names()]
    try:
        producing = asyncio.create_task(_produce(cluster, events, loop.produce_s))
        killing = asyncio.create_task(_fault_loop(cluster, observer, loop))
        while not (producing.done() and killing.done()):
            await observer.refresh()
        await producing
        victims = await killing
        faults_ended = time.monotonic()
        deadline = faults_ended + loop.deadline_s
        drained = False
        lagging: dict[str, int] = {}
        while time.monotonic() < deadline:
            await observer.refresh()
            done = observer.applied.keys() | observer.dead.keys()
            if ids <= done:
                lagging = await _lagging(cluster, topics)
                if not lagging:
                    drained = True
                    break
        settled = time.monotonic()
        spans, left, killed = await _spans(observer)
        ends = Ends(left, killed, set(cluster.member_pids()), await _frozen(observer))
        order = await observer.order()
        runs = await observer.runs()
        reached = await observer.reached()
        failed = int(await observer.redis.hlen(f"{cluster.prefix}:failed"))
        tiers = await _tier_entries(cluster)
    finally:
        await observer.close()
        await cluster.stop()
    overlaps = find_overlaps(spans, ends)
    _keep(cluster, spans, ends)
    lost = sorted(ids - observer.applied.keys() - observer.dead.keys())
    result: dict[str, object] = {
        "scenario": "freeze loop" if loop.freezes else "crash loop",
        "transport": cluster.transport,
        "events": len(events),
        "drained": drained,
        "lost": len(lost),
        "order_violations": order_violations(order),
        "overlaps": overlaps.certain,
        "overlaps_same_member": overlaps.same_member,
        "overlaps_uncertain": overlaps.uncertain,
        "overlaps_in_flight_when_frozen": overlaps.in_flight_when_frozen,
        "overlapped_runs": dict(overlaps.kinds),
        "applied": sum(1 for e in observer.applied if e in ids),
        "dead": dict(Counter(observer.dead.values())),
        "dead_errors": dict(observer.dead_errors),
        "injected_failures": failed,
        "retry_tier_entries": tiers,
        "handler_runs": len(spans),
        "repeated_effects": sum(n - 1 for n in runs.values() if n > 1),
        "last_run_order_violations": last_run_order_violations(reached),
        "kills": len(victims) if not loop.freezes else 0,
        "freezes": len(victims) if loop.freezes else 0,
        "member_restarts": cluster.restarts,
        "crashes": dict(Counter(cluster.crashes)),
        "settle_s": round(settled - faults_ended, 1),
        "wall_s": round(time.monotonic() - began, 1),
    }
    print(json.dumps(result))  # noqa: T201 - the figures are part of the test's output
    failures = [
        *([] if drained else [f"not settled within {loop.deadline_s}s; lag {lagging}"]),
        *([f"{len(lost)} lost, e.g. {lost[:5]}"] if lost else []),
        *(
            [f"dead letters without a known reason: {dict(Counter(observer.dead.values()))}"]
            if not set(observer.dead.values()) <= DEAD_REASONS
            else []
        ),
        *(
            [
                f"{result['order_violations']} order violations:"
                + "".join(f"\n  {line}" for line in order_examples(order, spans, ends))
            ]
            if result["order_violations"]
            else []
        ),
        *(
            [
                f"{overlaps.certain} overlaps of one key:"
                + "".join(f"\n  {line}" for line in overlaps.examples)
                + cluster.decisions(overlaps.keys[:2], lines=40)
            ]
            if overlaps.certain
            else []
        ),
    ]
    assert not failures, "\n".join([*failures, json.dumps(result, indent=1)])
    return result
