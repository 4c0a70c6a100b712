"""The demo's pieces on their own: signing, the traffic plan, observations and the statistics."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from redis.asyncio import Redis
from rich.console import Console

from demo.audit import Audit
from demo.dashboard import progress_line, render
from demo.observe import Observation, RedisObservations
from demo.stats import SMALL, Collector, percentile
from demo.summary import Snapshot, summary, summary_table
from demo.traffic import FLOODER, noisy_neighbour_plan, sign_hub
from pipeline.ingress.errors import Rejected
from pipeline.ingress.verify.hub import HubSignatureVerifier
from pipeline.logstore import RowState


def _obs(tenant: str, wait_ms: int, **fields: object) -> Observation:
    base: dict[str, object] = {
        "tenant": tenant,
        "lane": "engagement",
        "key": "c1",
        "event_id": "e1",
        "received_ms": 1_000,
        "started_ms": 1_000 + wait_ms,
        "finished_ms": 1_050 + wait_ms,
        "outcome": "ok",
        "size": 1,
        "attempt": 1,
    }
    base.update(fields)
    return Observation(**base)  # type: ignore[arg-type]


def test_generator_signature_passes_the_ingress_verifier():
    """A body signed by the generator is accepted by the Meta verifier and a changed one is not."""
    body = json.dumps({"id": "1", "tenant": "t"}).encode()
    verifier = HubSignatureVerifier(["s3cret"])
    verifier.verify({"x-hub-signature-256": sign_hub("s3cret", body)}, body, 0.0)
    with pytest.raises(Rejected):
        verifier.verify({"x-hub-signature-256": sign_hub("s3cret", body)}, body + b" ", 0.0)


def test_plan_has_fifty_steady_tenants_and_one_flooder_mid_run():
    """The plan holds 50 steady tenants from the start and a flooder far busier in the middle."""
    plan = noisy_neighbour_plan(100.0)
    steady = [t for t in plan.tenants if t.name != FLOODER]
    (flooder,) = [t for t in plan.tenants if t.name == FLOODER]
    assert len(steady) == 50
    assert all(t.start_s == 0 and t.end_s is None for t in steady)
    assert flooder.rate_per_s > 10 * sum(t.rate_per_s for t in steady) / len(steady)
    assert 0 < flooder.start_s < flooder.end_s < plan.duration_s  # type: ignore[operator]


def test_percentile_is_nearest_rank():
    """Percentiles use the nearest rank and are None for no samples."""
    assert percentile([], 0.99) is None
    assert percentile(list(range(1, 101)), 0.99) == 99
    assert percentile([5], 0.5) == 5


def test_collector_separates_flooder_small_tenants_turns_and_stale_events():
    """Waits split into flooder and small tenants; turns and retried turns are counted apart."""
    collector = Collector(start_ms=500)
    collector.add_all(
        [
            _obs("tenant-01", 10),
            _obs("tenant-02", 30),
            _obs(FLOODER, 900),
            _obs("tenant-03", 99_999, received_ms=100),  # before the run: ignored
            _obs("tenant-01", 5_000, attempt=2),  # a retry's wait includes its tier delay
            _obs("tenant-04", 4_000, lane="ai_turns", size=3),
            _obs("tenant-05", 4_000, lane="ai_turns", key="c2", size=2, outcome="retry"),
        ]
    )
    assert collector.small.samples == [10, 30]
    assert collector.flooder().samples == [900]
    assert collector.turns == 1
    assert collector.messages_per_turn == 3
    assert collector.turn_messages_in_retry == 2
    collector.add(_obs("tenant-05", 10, lane="ai_turns", key="c2", size=3, attempt=2))
    assert collector.turn_messages_in_retry == 0
    assert collector.handled_messages == 4 + 3 + 3  # ok calls of this run, turns by size
    assert collector.wait_series(SMALL, 0.99)[1] == [30]


def test_summary_counts_lost_as_accepted_minus_every_known_fate():
    """Lost is accepted minus handled, dead-lettered and waiting for a retry (pipeline counts)."""
    collector = Collector(start_ms=0)
    snapshot = Snapshot(
        transport="redis",
        elapsed_s=1.0,
        duration_s=1.0,
        phase="done",
        traffic={"accepted": 100, "by_kind": {"ai": 10}},
        rows={RowState.PROCESSED: 95, RowState.PRODUCED: 5},
        dead_lettered=3,
        retried=4,
        in_retry=4,
        collector=collector,
    )
    assert snapshot.lost == 1  # an estimate from the live counts
    data = summary(snapshot)
    assert (data["handled"], data["dead_lettered"], data["in_retry"]) == (92, 3, 4)
    assert (data["lost"], data["audit_complete"]) == (None, False)  # no audit: not a number
    snapshot.audit = Audit(unfinished=5, in_retry=3, waiting=2, complete=True)  # exact counts
    assert (summary(snapshot)["in_retry"], summary(snapshot)["lost"]) == (3, 0)


def test_an_incomplete_audit_reports_lost_as_unknown():
    """An audit that did not read every topic (an interrupted run) gives no lost count."""
    snapshot = Snapshot(
        transport="redis",
        elapsed_s=1.0,
        duration_s=60.0,
        phase="done",
        traffic={"accepted": 200},
        rows={RowState.PROCESSED: 60, RowState.PRODUCED: 140},
        dead_lettered=0,
        retried=0,
        in_retry=0,
        collector=Collector(start_ms=0),
        interrupted=True,
        audit=Audit(unfinished=140, in_retry=5, waiting=3, complete=False),
    )
    data = summary(snapshot)
    assert (data["lost"], data["audit_complete"]) == (None, False)
    console = Console(record=True, width=120)
    console.print(summary_table(data))
    assert "unknown (audit incomplete)" in console.export_text()


def test_an_interrupted_run_says_so_in_its_summary_table():
    """The table printed after Ctrl-C says the run was interrupted; a finished run's does not."""
    snapshot = Snapshot(
        transport="redis",
        elapsed_s=1.0,
        duration_s=60.0,
        phase="done",
        traffic={"accepted": 10},
        rows={RowState.PROCESSED: 10},
        dead_lettered=0,
        retried=0,
        in_retry=0,
        collector=Collector(start_ms=0),
        interrupted=True,
    )
    console = Console(record=True, width=120)
    console.print(summary_table(summary(snapshot)))
    assert "demo summary (interrupted: Ctrl-C or SIGTERM)" in console.export_text()
    snapshot.interrupted = False
    console.print(summary_table(summary(snapshot)))
    assert console.export_text().count("interrupted") == 0


@pytest.mark.redis
async def test_observations_round_trip_through_a_bounded_stream(redis_service, unique):
    """Observations written with XADD MAXLEN ~ read back in order and the stream stays bounded."""
    redis = Redis.from_url(redis_service)
    sink = RedisObservations(redis, f"test{unique}", max_len=100)
    try:
        for i in range(500):
            await sink.record(_obs("tenant-01", i))
        last, first_batch = await sink.read("0", count=50)
        _, rest = await sink.read(last, count=10_000)
        waits = [o.wait_ms for o in first_batch + rest]
        assert waits == sorted(waits)
        assert waits[-1] == 499
        assert len(waits) < 500  # trimmed, approximately to max_len
        assert await redis.xlen(f"{{test{unique}:demo}}:obs") < 500
    finally:
        await redis.delete(f"{{test{unique}:demo}}:obs")
        await redis.aclose()


def test_dashboard_renders_every_section():
    """One dashboard frame shows the flow, the tenants' waits and the debounced turns."""
    collector = Collector(start_ms=500)
    collector.add_all([_obs("tenant-01", 10), _obs(FLOODER, 900)])
    snapshot = Snapshot("redis", 3.0, 20.0, "traffic", {"accepted": 2}, {}, 0, 0, 0, collector)
    console = Console(record=True, width=120)
    console.print(render(snapshot))
    text = console.export_text()
    for expected in ("accepted", "tenant-flood (flooder)", SMALL, "debounced AI turns", "900"):
        assert expected in text


def test_progress_line_says_n_a_for_a_wait_not_measured_yet():
    """Before any observation the headless line prints n/a, never "None ms"; then milliseconds."""
    collector = Collector(start_ms=500)
    snapshot = Snapshot("redis", 3.0, 20.0, "traffic", {"accepted": 0}, {}, 0, 0, 0, collector)
    line = progress_line(snapshot)
    assert "None" not in line
    assert "small p99 n/a" in line
    assert "flooder p99 n/a" in line
    collector.add_all([_obs("tenant-01", 10), _obs(FLOODER, 900)])
    line = progress_line(snapshot)
    assert "small p99 10 ms" in line
    assert "flooder p99 900 ms" in line


@pytest.mark.parametrize("module", ["demo", "demo.traffic"])
def test_help_is_plain_text_without_rest_markup(module: str) -> None:
    """`python -m demo --help` describes the demo in plain words, no ``literals`` or :roles:."""
    shown = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "noisy-neighbour" in shown
    for markup in ("``", ":mod:", ":func:", ":class:", "*burst*"):
        assert markup not in shown, shown


def test_dashboard_marks_the_flood_and_explains_in_retry():
    """The header and the headless line name the flood's stage; a legend explains "in retry"."""
    collector = Collector(start_ms=500)
    # A 100 s plan floods from 25 s to 70 s.
    for elapsed, stage in ((10.0, "calm"), (50.0, "flood"), (90.0, "after flood")):
        snapshot = Snapshot("redis", elapsed, 100.0, "traffic", {}, {}, 0, 0, 0, collector)
        console = Console(record=True, width=200)
        console.print(render(snapshot))
        text = console.export_text()
        assert f"traffic: {stage} " in text.splitlines()[0]
        assert "in retry: events waiting for a later attempt" in text
        assert f"s traffic: {stage}, accepted 0" in progress_line(snapshot)
    draining = Snapshot("redis", 101.0, 100.0, "draining", {}, {}, 0, 0, 0, collector)
    assert "s draining: accepted 0" in progress_line(draining)
