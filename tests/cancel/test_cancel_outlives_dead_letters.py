"""A cancellation stands as long as the work it covers can come back (a dead letter redriven).

The cancellation's state has no Redis expiry: each one ends at its ``until``, judged by Redis's
clock, so the tests age it by moving its times back, as that clock would over the days.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from runtime.helpers import eventually, lane_spec, running
from runtime.owned import Declare
from typer.testing import CliRunner

from pipeline import headers as h
from pipeline.cancel.keys import CancelKeys
from pipeline.cancel.target import Selectors, facts_of
from pipeline.cli import app as cli
from pipeline.config import RuntimeSettings
from pipeline.envelope import Message
from pipeline.runtime import App, Context
from pipeline.runtime.idempotency import once_ttl_ms
from pipeline.runtime.member import Member
from pipeline.topics.spec import DLQ_MIN_RETENTION_MS
from pipeline.transport.protocol import Transport

DAY_MS = 86_400_000
QUICK = RuntimeSettings(commit_interval_ms=100, shutdown_grace_s=5.0, cancel_poll_ms=50)


def _kept_ms(client: SyncRedis, prefix: str, field: str) -> int:
    """How long the cancellation ``field`` stands from its millisecond (its until less its at)."""
    entry = json.loads(client.hget(CancelKeys(prefix).selectors, field) or b"{}")
    return int(str(entry["until"])) - int(str(entry["at"]))


async def _age(redis: Redis, prefix: str, duration_ms: int) -> None:
    """Move every cancellation under ``prefix`` ``duration_ms`` into the past, times and index."""
    keys = CancelKeys(prefix)
    for field, raw in (await redis.hgetall(keys.selectors)).items():
        entry = json.loads(raw)
        entry["at"] = int(str(entry["at"])) - duration_ms
        entry["until"] = int(str(entry["until"])) - duration_ms
        await redis.hset(keys.selectors, field, json.dumps(entry))
        await redis.zadd(keys.until, {field: entry["until"]})


@pytest.fixture
def cli_prefix(
    redis_service: str, unique: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[str]:
    """The CLI's key prefix and topics directory for this test; its keys are deleted after."""
    name = f"t{unique}"
    monkeypatch.setenv("PIPELINE_REDIS__URL", redis_service)
    monkeypatch.setenv("PIPELINE_REDIS__KEY_PREFIX", name)
    monkeypatch.setenv("PIPELINE_TOPICS_DIR", str(tmp_path))
    yield name
    client = SyncRedis.from_url(redis_service)
    client.delete(*CancelKeys(name).all())
    client.close()


def _declare_files(directory: Path, *lanes: dict[str, object]) -> None:
    for lane in lanes:
        (directory / f"{lane['name']}.yaml").write_text(yaml.safe_dump(lane))


def test_the_cli_keeps_a_cancellation_as_long_as_its_lanes_keep_dead_letters(
    cli_prefix: str, redis_service: str, tmp_path: Path
) -> None:
    """`pipeline cancel` stands the longest once-bound of the lanes it covers, at least 14 days."""
    short = {"name": "short_lane", "partitions": 1}
    long = {"name": "long_lane", "partitions": 1, "retention": "30d"}
    _declare_files(tmp_path, short, long)
    for args in (["--key", "K"], ["--key", "K", "--lane", "short_lane"]):
        result = CliRunner().invoke(cli, ["cancel", *args])
        assert result.exit_code == 0, result.output
    client = SyncRedis.from_url(redis_service)
    try:
        everywhere = _kept_ms(client, cli_prefix, "key:*:K")
        one_lane = _kept_ms(client, cli_prefix, "key:short_lane:K")
    finally:
        client.close()
    assert one_lane == once_ttl_ms(lane_spec(**short))
    assert one_lane > DLQ_MIN_RETENTION_MS
    assert everywhere == once_ttl_ms(lane_spec(**long))
    assert everywhere > 30 * DAY_MS


def test_a_lane_kept_for_ever_is_cancelled_with_an_exact_bound_members_read(
    cli_prefix: str, redis_service: str, tmp_path: Path
) -> None:
    """A retention of 2**63-1 ms: the bound is 2**62 ms, exact in Redis, and members read it.

    Through Lua as a number it became a float (4.6e+18 in the JSON) that members could not read.
    """
    _declare_files(tmp_path, {"name": "kept_lane", "partitions": 1, "retention": 2**63 - 1})
    result = CliRunner().invoke(cli, ["cancel", "--event", "E"])
    assert result.exit_code == 0, result.output
    client = SyncRedis.from_url(redis_service)
    try:
        raw = client.hget(CancelKeys(cli_prefix).selectors, "event:*:E")
        score = client.zscore(CancelKeys(cli_prefix).until, "event:*:E")
    finally:
        client.close()
    entry = json.loads(raw or b"{}")
    at_ms = int(str(entry["at"]))
    assert int(str(entry["until"])) - at_ms == 2**62
    assert score == float(at_ms + 2**62)
    selectors = Selectors(1, {"event:*:E": entry})  # as a member holds it (json.loads)
    message = Message("kept_lane", 0, 0, b"k", b"", {h.EVENT_ID: b"E"}, at_ms)
    assert selectors.reason("kept_lane", facts_of(message, "x"), at_ms + 400 * DAY_MS)


async def test_a_dead_letter_redriven_in_its_second_week_stays_cancelled(
    transport: Transport, redis: Redis, prefix: str, unique: str, lanes: Declare
) -> None:
    """A key cancelled by app.cancel 8 days ago: its dead letter, redriven now, does not run."""
    spec = lane_spec(f"dlk_{unique}", 1)
    await lanes(spec)
    app = App([spec])
    ran: list[bytes] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        ran.append(event)

    await app.cancel(redis, key="conv-42", reason="user left", prefix=prefix)
    await _age(redis, prefix, 8 * DAY_MS)
    entry = json.loads(await redis.hget(CancelKeys(prefix).selectors, "key:*:conv-42") or b"{}")
    # The dead letter's first delivery came before the cancellation; redrive keeps its time.
    first_ms = int(str(entry["at"])) - 60_000
    producer = transport.producer()
    await producer.send(
        spec.name,
        b"dead letter",
        key=b"conv-42",
        headers={h.PRODUCED_AT_MS: str(first_ms).encode()},
    )
    await producer.close()
    member = Member(app, transport, f"g-{unique}", QUICK, redis=redis, redis_prefix=prefix)
    async with running(member):
        await eventually(lambda: member.stats.cancelled + member.stats.handled >= 1)
    assert ran == []
    assert member.stats.cancelled == 1


def test_without_declarations_the_cli_cancels_for_15_days_and_warns(
    cli_prefix: str, redis_service: str
) -> None:
    """No topics to read the lanes from: the cancellation is made all the same, with the floor."""
    result = CliRunner().invoke(cli, ["cancel", "--tenant", "acme"])
    assert result.exit_code == 0, result.output
    assert "no topic declarations" in result.stderr
    assert "stands 15d" in result.stderr
    client = SyncRedis.from_url(redis_service)
    try:
        assert _kept_ms(client, cli_prefix, "tenant:*:acme") == DLQ_MIN_RETENTION_MS + DAY_MS
    finally:
        client.close()
