"""`pipeline cancel` records a cancellation (one line on bad input), and status shows counts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from rich.console import Console
from typer.testing import CliRunner

from pipeline.cancel.keys import CancelKeys
from pipeline.cancel.status import read_counts, render_counts
from pipeline.cli import app as cli
from pipeline.cli.status import Status


@pytest.fixture
def prefix(redis_service: str, unique: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The CLI's key prefix for this test; its cancellation keys are deleted after."""
    name = f"t{unique}"
    monkeypatch.setenv("PIPELINE_REDIS__URL", redis_service)
    monkeypatch.setenv("PIPELINE_REDIS__KEY_PREFIX", name)
    yield name
    client = SyncRedis.from_url(redis_service)
    client.delete(*CancelKeys(name).all())
    client.close()


def test_cancel_records_a_standing_cancellation(prefix: str, redis_service: str) -> None:
    """`pipeline cancel --key K --reason R` stores the selector the members read."""
    result = CliRunner().invoke(cli, ["cancel", "--key", "doc-7", "--reason", "tab closed"])
    assert result.exit_code == 0, result.output
    # The count is of registered long work only: the line must not say nothing running stops.
    assert result.stdout.strip() == (
        "cancelled key doc-7 (tab closed); long work told to stop: 0; other work it covers,"
        " running or not, stops when its member next looks (PIPELINE_RUNTIME__CANCEL_POLL_MS)"
    )
    client = SyncRedis.from_url(redis_service)
    try:
        entry = json.loads(client.hget(CancelKeys(prefix).selectors, "key:*:doc-7") or b"{}")
    finally:
        client.close()
    assert entry["reason"] == "tab closed"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cancel"], "name exactly one of an event id, a key or a tenant"),
        (["cancel", "--key", "k", "--tenant", "t"], "name exactly one of"),
        (["cancel", "--key", "k", "--lane", "no_such_lane"], "--lane: no lane 'no_such_lane'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(prefix: str, args: list[str], message: str) -> None:
    """Nothing or two targets, or an unknown lane, is refused with one line, exit 2."""
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_unreachable_redis_names_the_address_and_variable(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Redis that does not answer: exit 1, one line naming where and what to set."""
    monkeypatch.setenv("PIPELINE_REDIS__URL", "redis://127.0.0.1:1/0")
    result = CliRunner().invoke(cli, ["cancel", "--tenant", "acme"])
    assert result.exit_code == 1
    assert "redis://127.0.0.1:1/0" in result.stderr
    assert "PIPELINE_REDIS__URL" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_status_shows_cancelled_and_hung_counts_per_lane(prefix: str, redis_service: str) -> None:
    """The members' counts come back per lane, in the JSON document and the screen."""
    client = SyncRedis.from_url(redis_service)
    try:
        client.hset(
            CancelKeys(prefix).counts,
            mapping={"messages:cancelled": 5, "messages:hung": 1, "ai_turns:cancelled": 2},
        )
    finally:
        client.close()

    async def read() -> dict[str, dict[str, int]] | None:
        redis = Redis.from_url(redis_service)
        try:
            return await read_counts(redis, prefix)
        finally:
            await redis.aclose()

    counts = asyncio.run(read())
    assert counts == {
        "messages": {"cancelled": 5, "hung": 1},
        "ai_turns": {"cancelled": 2, "hung": 0},
    }
    status = Status("redis", (), cancellations=counts)
    assert json.loads(json.dumps(status.to_json()))["cancellations"] == counts
    console = Console(record=True, width=200)
    render_counts(counts, console)
    assert console.export_text().strip() == (
        "cancelled / hung: ai_turns cancelled 2, hung 0; messages cancelled 5, hung 1"
    )
