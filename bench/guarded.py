"""``pipeline consume`` against a bare member, and retries at 1 %, each consumer its own process.

Two parts of ``bench/runtime.py`` (its docstring has the method and the fields):

* :func:`bench_wire`: the same Kafka lane (``--wire-messages`` of 1 KiB over 1,000 keys on 4
  partitions, ordered, the no-op handler of ``bench/lane_app.py`` writing one byte per message)
  drained by a bare member without Redis and by ``pipeline consume`` (default settings, a
  private Redis, the metrics endpoint on), once for the lane with retry tiers ``1s, 5s`` and once
  for the same lane without ``retry:``.
* :func:`bench_retries`: ``pipeline consume`` of a lane with retry tiers ``200ms, 1s`` over
  ``--retry-messages``, with 1 % of the messages failing once against none failing; the handler
  (``checked`` mode) counts order violations, duplicates and overlapping runs of one key.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import rotated
from ingress import free_port
from lane_process import (
    CpuPart,
    Drain,
    PrivateRedis,
    bare_cmd,
    consume_cmd,
    drain,
    write_lane,
)

from pipeline.topics.durations import parse_duration_ms
from pipeline.topics.spec import TopicSpec

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from runtime import Harness

WIRE_PARTITIONS = 4
WIRE_KEYS = 1000
WIRE_TIERS = ["1s", "5s"]
WIRE_RUNNERS = ("bare_tiers", "consume_tiers", "bare_plain", "consume_plain")
RETRY_PARTITIONS = 12
RETRY_KEYS = 1000
RETRY_TIERS = ["200ms", "1s"]
FAIL_MODULO = 100  # crc32(value) % 100 == 0: 1 % of the messages fail once
RUN_TIMEOUT_S = 300.0
SETTLE_TIMEOUT_S = 30.0


def _name(kind: str) -> str:
    return f"bench_{kind}_{uuid.uuid4().hex[:12]}"


def _env(h: Harness, spec: dict[str, Any], **extra: str) -> dict[str, str]:
    """The consumer's environment: Kafka from the harness's settings, the lane, ``extra``."""
    return {
        **os.environ,
        "PIPELINE_TRANSPORT": "kafka",
        "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": h.bootstrap,
        "BENCH_LANE": spec["lane"],
        **extra,
    }


async def _run(
    h: Harness,
    spec: dict[str, Any],
    expected: int,
    *,
    bare: bool,
    mode: str = "count",
    fail_modulo: int = 0,
    hold_ms: float = 1.0,
    settle: bool = False,
    extra_env: Mapping[str, str] | None = None,
) -> Drain:
    """One consumer process on a fresh group (and, for ``pipeline consume``, a private Redis)."""
    label = f"{'bare member' if bare else 'pipeline consume'} on {spec['name']}"
    group = _name("g")
    workdir = Path(tempfile.mkdtemp(prefix="bench-lane-"))
    redis = None if bare else PrivateRedis(workdir / "redis")
    env = _env(h, spec, BENCH_MODE=mode, BENCH_FAIL_MODULO=str(fail_modulo), **(extra_env or {}))
    env["BENCH_HOLD_MS"] = str(hold_ms)
    if redis is not None:
        redis.start()
        env["PIPELINE_REDIS__URL"] = redis.url
        env["PIPELINE_RUNTIME__METRICS_PORT"] = str(free_port())
    topics = TopicSpec.model_validate(spec).topic_names()

    async def settled() -> dict[str, Any]:
        return await _settle(h, group, topics)

    try:
        write_lane(workdir, spec)
        cmd = bare_cmd(group) if bare else consume_cmd(group)
        return await drain(
            label,
            cmd,
            workdir,
            env,
            expected,
            RUN_TIMEOUT_S,
            settle=settled if settle else None,
            redis=redis,
        )
    finally:
        if redis is not None:
            redis.stop()
        await h.drop_group(group)
        shutil.rmtree(workdir, ignore_errors=True)


async def _settle(h: Harness, group: str, topics: list[str]) -> dict[str, Any]:
    """Wait until the group's commits reach the end of every topic; entries per topic."""
    settled = False
    ends: dict[str, int] = {}
    deadline = asyncio.get_running_loop().time() + SETTLE_TIMEOUT_S
    while True:
        behind = False
        for topic in topics:
            lags = await h.admin.group_lag(group, topic)
            ends[topic] = sum(lag.end for lag in lags)
            behind = behind or any(
                lag.end > 0 and (lag.committed is None or lag.committed < lag.end) for lag in lags
            )
        if not behind:
            settled = True
            break
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.5)
    return {"settled": settled, "entries": ends}


# -- guarded lane against the bare member ---------------------------------------------------------


@dataclass(slots=True)
class Wire:
    """Interleaved runs of the four runners, per repeat."""

    runs: dict[str, list[Drain]] = field(default_factory=lambda: {r: [] for r in WIRE_RUNNERS})

    def ratios(self, consume: str, bare: str) -> list[float]:
        """``consume`` msgs/s ÷ ``bare`` msgs/s, per repeat."""
        return [
            c.msgs_s / b.msgs_s for c, b in zip(self.runs[consume], self.runs[bare], strict=True)
        ]


def _wire_spec(name: str, *, tiers: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "partitions": WIRE_PARTITIONS,
        "lane": name,
        "ordered": True,
    }
    if tiers:
        spec["retry"] = {"tiers": WIRE_TIERS}
    return spec


async def bench_wire(h: Harness, n: int, repeats: int) -> Wire:
    """Produce each lane once, then ``repeats`` rounds of the four runners in rotated order."""
    result = Wire()
    specs = {
        "tiers": _wire_spec(_name("wire_t"), tiers=True),
        "plain": _wire_spec(_name("wire_p"), tiers=False),
    }
    names = [n for s in specs.values() for n in TopicSpec.model_validate(s).topic_names()]
    try:
        for spec in specs.values():
            await h.declare(TopicSpec.model_validate(spec))
            await h.produce(spec["name"], n, WIRE_KEYS)
        for i in range(repeats):
            line = []
            for runner in rotated(WIRE_RUNNERS, i):
                kind, lane = runner.split("_")
                span = await _run(h, specs[lane], n, bare=kind == "bare")
                result.runs[runner].append(span)
                calls = span.redis_calls_per_msg
                line.append(
                    f"{runner} {span.msgs_s:,.0f}/s"
                    + (f" ({calls:.2f} redis/msg)" if calls is not None else "")
                )
            print(f"  wire {i + 1}/{repeats}: " + ", ".join(line), file=sys.stderr, flush=True)
    finally:
        await h.drop_topics(names)
    return result


async def consume_run(
    h: Harness, spec: dict[str, Any], n: int, extra_env: Mapping[str, str] | None = None
) -> Drain:
    """``pipeline consume`` of the lane ``spec`` (already declared and filled) over ``n`` messages.

    As :func:`bench_wire` runs it (no-op handler, a private Redis, metrics on); ``extra_env`` is
    added to its environment (for example the ``OTEL_*`` variables that turn tracing on).
    """
    return await _run(h, spec, n, bare=False, extra_env=extra_env)


def wire_spec(name: str) -> dict[str, Any]:
    """The wire part's lane with retry tiers: what users run."""
    return _wire_spec(name, tiers=True)


# -- retries at 1 % --------------------------------------------------------------------------------


@dataclass(slots=True)
class Retries:
    """Interleaved (no failures, 1 % failures) runs of ``pipeline consume`` on fresh lanes."""

    clean: list[Drain] = field(default_factory=list)
    failing: list[Drain] = field(default_factory=list)

    def total(self, name: str) -> int:
        """A handler counter summed over every run."""
        return sum(int(d.stats.get(name, 0)) for d in [*self.clean, *self.failing])

    @property
    def costs(self) -> list[float]:
        """1 - failing/clean msgs/s per pair."""
        return [1 - f.msgs_s / c.msgs_s for c, f in zip(self.clean, self.failing, strict=True)]

    @property
    def cpu_costs(self) -> list[float]:
        """1 - clean CPU per message ÷ failing CPU per message, per pair: the failures' CPU."""
        return [
            1 - (c.cpu_s / c.messages) / (f.cpu_s / f.messages)
            for c, f in zip(self.clean, self.failing, strict=True)
        ]

    @property
    def cpu_ms_per_failure(self) -> list[float]:
        """Per pair, the failing run's extra CPU (process tree) per injected failure, in ms."""
        return self._per_failure(lambda run: run.cpu_s)

    def cpu_ms_per_failure_in(self, part: CpuPart) -> list[float]:
        """:attr:`cpu_ms_per_failure` of one part of the consumer (its main thread, ...)."""
        return self._per_failure(lambda run: float(getattr(run.parts, part)))

    def _per_failure(self, cpu_s: Callable[[Drain], float]) -> list[float]:
        """Per pair, ``cpu_s`` of the failing run minus the clean run's per failure, in ms."""
        return [
            1000 * (cpu_s(f) - cpu_s(c)) / int(f.stats["injected_failures"])
            for c, f in zip(self.clean, self.failing, strict=True)
            if f.stats.get("injected_failures")
        ]

    @property
    def delay_floors(self) -> list[float]:
        """The cost the first tier's delay alone sets, per pair: 1 - clean span ÷ (it + delay).

        A message failing near the end of the backlog cannot succeed before its first retry is
        due, so the failing run lasts at least that delay longer than the clean one.
        """
        delay_s = parse_duration_ms(RETRY_TIERS[0]) / 1000
        return [1 - c.seconds / (c.seconds + delay_s) for c in self.clean]

    @property
    def amplifications(self) -> list[float | None]:
        """Retry-tier entries ÷ injected failures, per failing run."""
        return [
            d.stats["retry_entries"] / d.stats["injected_failures"]
            if d.stats.get("injected_failures")
            else None
            for d in self.failing
        ]


async def _retry_run(
    h: Harness, n: int, *, fail: bool, hold_ms: float, ordered: bool = True
) -> Drain:
    """One fresh lane with retry tiers, drained by ``pipeline consume`` until all succeeded.

    ``ordered``: the lane keeps per-key order across its tiers (parking); without it a
    failure is retried with nothing parked behind it.
    """
    name = _name("retry")
    spec = {
        "name": name,
        "partitions": RETRY_PARTITIONS,
        "lane": name,
        "ordered": ordered,
        "retry": {"tiers": RETRY_TIERS},
    }
    topic_spec = TopicSpec.model_validate(spec)
    await h.declare(topic_spec)
    try:
        await h.produce(name, n, RETRY_KEYS)
        span = await _run(
            h,
            spec,
            n,
            bare=False,
            mode="checked",
            fail_modulo=FAIL_MODULO,  # chosen in both runs (the same handler work) ...
            hold_ms=hold_ms,
            settle=True,
            extra_env={"BENCH_INJECT": "1" if fail else "0"},  # ... failing only in one
        )
        entries: dict[str, int] = span.stats.pop("entries", {})
        span.stats["retry_entries"] = sum(entries.get(t, 0) for t in topic_spec.retry_topic_names())
        span.stats["dead_lettered"] = entries.get(topic_spec.dead_letter, 0)
        return span
    finally:
        await h.drop_topics(topic_spec.topic_names())


async def bench_retries(
    h: Harness, n: int, repeats: int, hold_ms: float, *, ordered: bool = True
) -> Retries:
    """Interleaved pairs: without failures, with 1 % failing once."""
    result = Retries()
    for i in range(repeats):
        for fail in (False, True) if i % 2 == 0 else (True, False):
            span = await _retry_run(h, n, fail=fail, hold_ms=hold_ms, ordered=ordered)
            (result.failing if fail else result.clean).append(span)
        f = result.failing[-1]
        print(
            f"  retries {i + 1}/{repeats}: clean {result.clean[-1].msgs_s:,.0f}/s, "
            f"1% failing {f.msgs_s:,.0f}/s (injected {f.stats.get('injected_failures')}, "
            f"retry entries {f.stats.get('retry_entries')}, "
            f"overlaps {result.total('key_overlaps')}, "
            f"order violations {result.total('order_violations')})",
            file=sys.stderr,
            flush=True,
        )
    return result
