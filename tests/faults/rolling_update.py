"""The rolling-update scenario: members of two builds in one group on one ordered lane.

A Kubernetes rolling update (``maxSurge`` 25 %, ``maxUnavailable`` 25 %: one Pod more, none
less) runs the previous build's members beside the new build's in the same consumer group, on
the same lane, until the last old Pod is gone. :func:`run_rolling_update` starts one member of
each build (:class:`Rollout`, ``first``), produces the crash-loop scenario's events
(:func:`~faults.crashloop.crashloop_events`: ordered, retry tiers, a few flaky events) and,
while the load runs, replaces the member of build ``replaced`` as the Deployment does: a member of
build ``by`` starts beside it, and once that one polls the old one gets SIGTERM and is waited
for. Then it checks what the crash loop checks (nothing lost, first successes in order per key,
no two runs of one key at once), and also that the stopped member exited on its own, in time,
with status 0; that no key is left parked (the guard's parked keys and held followers are all
released); that no member crashed; and it returns the lines of every member's log that speak
of the group lease, the state marker, warnings and errors.

A build is a directory holding the ``pipeline`` package (a ``git worktree`` of an earlier
commit), put first on the member's ``PYTHONPATH``; ``None`` is this checkout's. The members run
this checkout's ``faults.crashloop_app`` whichever build imports it.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from faults.cluster import Cluster
from faults.crashloop import (
    CrashLoop,
    Ends,
    _lagging,
    _produce,
    _spans,
    crashloop_events,
    find_overlaps,
    order_violations,
)
from faults.runner import DEAD_REASONS, Event, Observer

from pipeline.retry.keys import guard_keys

POLLING = "consuming as group"
"""What a member's log says once it polls its group (its start line)."""
ASSIGNED = " assigned "
"""What a member's log says when its group gives it partitions."""
NOTABLE = (" WARNING ", " ERROR ", " CRITICAL ", "Traceback", "lease", "marker", "stop")
"""The log lines the scenario reports (DEBUG lines aside), whatever the build."""


@dataclass(frozen=True)
class Rollout:
    """Which builds run, and which one replaces which while the load runs."""

    first: tuple[str | None, ...]
    """The build of each member at the start (a ``pipeline`` checkout, None: this one)."""
    replaced: int = 0
    """The slot whose member is replaced."""
    by: str | None = None
    """The build of its replacement."""
    stop_within_s: float = 40.0
    """How long the stopped member may take (``terminationGracePeriodSeconds`` and more)."""
    settled: bool = True
    """Stop the old member once the new one was given partitions (the rebalance its join
    started is over), else as soon as the new one polls (amid that rebalance)."""
    at: float = 1 / 3
    """When the rollout starts, as a part of the load's production time."""
    key_bytes: int = 0
    """Pad every message key to this many bytes (0: the scenario's short keys)."""


@dataclass
class Stopped:
    """How the replaced member stopped."""

    pid: int = 0
    returncode: int | None = None
    seconds: float = 0.0
    replacement_polling_s: float = 0.0
    replacement_assigned_s: float = 0.0
    sent: int = 0
    """The scenario's clock just before SIGTERM."""


class MixedCluster(Cluster):
    """A :class:`Cluster` whose members each run the build they were started with."""

    def __init__(self, *args: object, builds: list[str | None], **options: object) -> None:
        """``builds``: the build of each member started, in order; later ones run the last."""
        super().__init__(*args, **options)  # type: ignore[arg-type]
        self._builds = list(builds)
        self.build_of: dict[int, str] = {}
        """Each member's build, by process id (``this`` for this checkout)."""

    async def _member(self) -> asyncio.subprocess.Process:
        build = self._builds.pop(0) if len(self._builds) > 1 else self._builds[0]
        plain = self.env
        self.env = dict(plain)
        if build is not None:
            self.env["PYTHONPATH"] = build
        try:
            proc = await super()._member()
        finally:
            self.env = plain
        self.build_of[proc.pid] = build or "this"
        return proc

    def add_build(self, build: str | None) -> None:
        """Have the next member started run ``build``."""
        self._builds.insert(0, build)

    def said(self, pid: int, what: str) -> int:
        """How many lines of the member ``pid``'s log hold ``what``."""
        log = self.directory / self.log_names()[pid]
        return log.read_text(encoding="utf-8", errors="replace").count(what)

    def notable(self, limit: int = 12) -> dict[str, list[str]]:
        """Per member log (``name build``): its first lines of :data:`NOTABLE` kinds."""
        out: dict[str, list[str]] = {}
        for pid, name in sorted(self.log_names().items(), key=lambda item: item[1]):
            text = (self.directory / name).read_text(encoding="utf-8", errors="replace")
            found = [
                line[:300]
                for line in text.splitlines()
                if " DEBUG " not in line and any(n in line for n in NOTABLE)
            ]
            out[f"{name} {self.build_of.get(pid, '?')}"] = found[:limit]
        return out


async def _replace(
    cluster: MixedCluster, observer: Observer, rollout: Rollout, at_s: float
) -> Stopped:
    """At ``at_s``: surge a member of ``rollout.by``, and once it polls, SIGTERM the old one."""
    await asyncio.sleep(at_s)  # the rollout starts while the load is produced
    stopped = Stopped()
    old = cluster.members[rollout.replaced]
    assert old is not None
    cluster.add_build(rollout.by)
    surged = time.monotonic()
    new = await cluster._member()
    cluster.members.append(new)
    cluster.member_count += 1
    while not cluster.said(new.pid, POLLING):  # its readiness: the start line
        assert new.returncode is None, f"the replacement exited with {new.returncode}"
        assert time.monotonic() - surged < 60, "the replacement never polled"
        await asyncio.sleep(0.2)  # polling its log
    stopped.replacement_polling_s = round(time.monotonic() - surged, 1)
    while rollout.settled and not cluster.said(new.pid, ASSIGNED):  # the rebalance's end
        assert time.monotonic() - surged < 60, "the replacement was never given partitions"
        await asyncio.sleep(0.2)  # polling its log
    stopped.replacement_assigned_s = round(time.monotonic() - surged, 1)
    cluster.members[rollout.replaced] = None  # no restart: the Deployment removes its Pod
    cluster._killed.add(old.pid)  # an exit of its own, not a crash
    clock = f"{cluster.prefix}:clock"
    before = int(await observer.redis.incr(clock))
    stopped.sent = before
    began = time.monotonic()
    old.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(rollout.stop_within_s):
            await old.wait()
    except TimeoutError:
        old.send_signal(signal.SIGKILL)  # the kubelet's kill at the end of the grace period
        await old.wait()
    after = int(await observer.redis.incr(clock))
    # A run that never left ran at most until its process was reaped (crashloop's bounds).
    await observer.redis.hset(f"{cluster.prefix}:killed", str(old.pid), f"{before}:{after}")
    stopped.pid = old.pid
    stopped.returncode = old.returncode
    stopped.seconds = round(time.monotonic() - began, 1)
    return stopped


@dataclass
class Leftovers:
    """The lane's guard keys left once everything was handled and committed."""

    parked: list[str] = field(default_factory=list)
    lease: dict[str, str] = field(default_factory=dict)


async def _leftovers(observer: Observer, lane: str, prefix: str = "pl") -> Leftovers:
    keys = guard_keys(prefix, lane)
    found = Leftovers()
    async for raw in observer.redis.scan_iter(match=f"{keys.tag}:*", count=1000):
        name = raw.decode()
        if name.startswith((f"{keys.tag}:z:", f"{keys.tag}:f:")) or name == keys.parked:
            found.parked.append(name)
    lease = await observer.redis.hgetall(keys.group)
    found.lease = {k.decode(): v.decode() for k, v in lease.items()}
    return found


async def run_rolling_update(
    cluster: MixedCluster, loop: CrashLoop, rollout: Rollout
) -> dict[str, object]:
    """Run the load through a rollout on ``cluster``; return the figures, fail on a defect."""
    events = crashloop_events(loop)
    if rollout.key_bytes:  # no blank: the app's records split on them
        events = [Event(e.seq, e.key.ljust(rollout.key_bytes, "x"), e.mode) for e in events]
    ids = {e.id for e in events}
    began = time.monotonic()
    await cluster.start(ingress=False)
    observer = Observer(cluster)
    topics = [cluster.lane, *cluster.spec.retry_topic_names()]
    try:
        producing = asyncio.create_task(_produce(cluster, events, loop.produce_s))
        replacing = asyncio.create_task(
            _replace(cluster, observer, rollout, loop.produce_s * rollout.at)
        )
        while not (producing.done() and replacing.done()):
            await observer.refresh()
        await producing
        stopped = await replacing
        deadline = time.monotonic() + loop.deadline_s
        drained = False
        lagging: dict[str, int] = {}
        while time.monotonic() < deadline:
            await observer.refresh()
            if ids <= observer.applied.keys() | observer.dead.keys():
                lagging = await _lagging(cluster, topics)
                if not lagging:
                    drained = True
                    break
        settle_s = round(time.monotonic() - deadline + loop.deadline_s, 1)
        spans, left, killed = await _spans(observer)
        ends = Ends(left, killed, set(cluster.member_pids()))
        order = await observer.order()
        runs = await observer.runs()
        leftovers = await _leftovers(observer, cluster.lane)
        failed = int(await observer.redis.hlen(f"{cluster.prefix}:failed"))
    finally:
        await observer.close()
        await cluster.stop()
    overlaps = find_overlaps(spans, ends)
    mine = [s for s in spans if s.pid == stopped.pid]
    stopped_runs = {
        "runs": len(mine),
        "in_flight_at_sigterm": sum(
            1 for s in mine if s.enter < stopped.sent < left.get(s.token, stopped.sent + 1)
        ),
        "started_after_sigterm": sum(1 for s in mine if s.enter > stopped.sent),
        "never_left": sum(1 for s in mine if s.token not in left),
    }
    lost = sorted(ids - observer.applied.keys() - observer.dead.keys())
    result: dict[str, object] = {
        "scenario": "rolling update",
        "builds": [Path(b).name if b else "this" for b in rollout.first],
        "replaced_by": Path(rollout.by).name if rollout.by else "this",
        "key_bytes": len(events[0].key),
        "events": len(events),
        "drained": drained,
        "lost": len(lost),
        "order_violations": order_violations(order),
        "overlaps": overlaps.certain,
        "overlaps_uncertain": overlaps.uncertain,
        "applied": sum(1 for e in observer.applied if e in ids),
        "dead": dict(Counter(observer.dead.values())),
        "injected_failures": failed,
        "handler_runs": len(spans),
        "repeated_effects": sum(n - 1 for n in runs.values() if n > 1),
        "stopped": vars(stopped) | stopped_runs,
        "crashes": dict(Counter(cluster.crashes)),
        "parked_left": leftovers.parked[:5],
        "lease_left": leftovers.lease,
        "settle_s": settle_s,
        "wall_s": round(time.monotonic() - began, 1),
        "logs": cluster.notable(),
    }
    print(json.dumps(result, indent=1))  # noqa: T201 - the figures are the scenario's output
    failures = [
        *([] if drained else [f"not settled within {loop.deadline_s}s; lag {lagging}"]),
        *([f"{len(lost)} lost, e.g. {lost[:5]}"] if lost else []),
        *([f"{result['order_violations']} order violations"] if result["order_violations"] else []),
        *([f"{overlaps.certain} overlaps: {overlaps.examples[:3]}"] if overlaps.certain else []),
        *([f"crashes: {cluster.crashes}"] if cluster.crashes else []),
        *([f"keys left parked: {leftovers.parked[:5]}"] if leftovers.parked else []),
        *(
            [f"the stopped member exited {stopped.returncode} after {stopped.seconds}s"]
            if stopped.returncode != 0
            else []
        ),
        *(
            [f"the stopped member's runs that never left: {stopped_runs['never_left']}"]
            if stopped_runs["never_left"]
            else []
        ),
        *(
            [f"dead letters without a known reason: {result['dead']}"]
            if not set(observer.dead.values()) <= DEAD_REASONS
            else []
        ),
    ]
    assert not failures, "\n".join(failures)
    return result
