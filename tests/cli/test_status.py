"""`pipeline status`: lanes, retry tiers and dead letters from real brokers, and the ingress log."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import yaml
from lane_support import drop, lane_spec, partly_consumed
from rich.console import Console
from support import test_settings as settings_for
from typer.testing import CliRunner

from pipeline.cli import app as cli
from pipeline.cli.status import LaneStatus, Status, collect_status
from pipeline.cli.status_view import gather, render
from pipeline.logstore import NewRow
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.observability.lanes import LaneReport, lane_watches
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport


def write_spec(directory: Path, spec: TopicSpec) -> Path:
    """Write ``spec`` as the only declaration of a topics directory."""
    directory.mkdir(parents=True, exist_ok=True)
    document = {"name": spec.name, "partitions": spec.partitions, "lane": spec.lane}
    document["retry"] = {"tiers": ["5s"]}
    (directory / f"{spec.name}.yaml").write_text(yaml.safe_dump(document), encoding="utf-8")
    return directory


async def partly_consumed_status(
    transport, spec: TopicSpec, group: str, groups: list[str], tmp_path: Path
) -> Status:
    """The status of ``spec``'s lane, 5 messages produced and 2 committed by ``group``.

    ``spec`` is the only declaration of a topics directory under ``tmp_path``; the status is
    read for ``groups`` (none: the group named after the lane), without the ingress log. The
    lane's topics are dropped after.
    """
    settings = settings_for(
        topics_dir=write_spec(tmp_path / "topics", spec), transport=transport.name
    )
    try:
        async with partly_consumed(transport, spec, group, produced=5, committed=2):
            return await gather(settings, groups, with_log=False)
    finally:
        await drop(transport, spec)


async def test_status_shows_lag_age_tiers_and_dead_letters(transport, unique, tmp_path):
    """The status of a half-consumed lane has its lag, an age, a retry tier and a dead letter."""
    spec = lane_spec(f"obs-status-{unique}")
    group = f"g-{unique}"
    status = await partly_consumed_status(transport, spec, group, [group], tmp_path)
    (lane,) = status.lanes
    assert (lane.report.lane, lane.report.group, lane.report.lag) == (spec.lane, group, 3)
    assert lane.report.oldest_age_s >= 0
    assert lane.report.retry_tiers == {"5s": 1}
    assert lane.report.dead_letters == 1
    document = json.loads(json.dumps(status.to_json()))
    assert document["lanes"][0]["lag"] == 3
    assert document["transport"] == transport.name
    console = Console(record=True, width=200)
    render(status, console)
    text = console.export_text()
    assert spec.lane in text
    assert "5s:1" in text


def row(row_id: str, received_at_ms: int) -> NewRow:
    """A log row of the messages lane."""
    return NewRow(
        row_id, "github", "acme", "k", "messages", "messages", row_id, received_at_ms, {}, b"{}"
    )


async def test_status_reads_abandoned_rows_and_ages_from_the_log(
    redis_service, settings, unique, tmp_path
):
    """Rows per state, the abandoned count and the oldest unproduced row's age are reported."""
    store = SqliteLogStore(tmp_path / "ingress.db")
    transport = create_transport(settings, "redis")
    await store.open()
    try:
        for row_id, at_ms in (("0001", 1_000_000), ("0002", 1_010_000), ("0003", 1_020_000)):
            await store.insert(row(row_id, at_ms))
        await store.mark_produced(["0002", "0003"])
        await store.abandon(["0003"], "replayed too often")
        watches = lane_watches([lane_spec(f"obs-none-{unique}")], only_groups=["g"])
        status = await collect_status(
            transport.name, transport.admin(), watches, store=store, clock=lambda: 1_060.0
        )
    finally:
        await store.close()
        await transport.close()
    assert status.log is not None
    assert status.log.rows == {"received": 1, "produced": 1, "abandoned": 1}
    assert status.log.abandoned == 1
    assert status.log.oldest_unproduced_age_s == 60.0
    assert status.log.oldest_unprocessed_age_s == 50.0


def test_status_command_prints_json(redis_service, unique, tmp_path, monkeypatch):
    """`pipeline status --json --group G` prints one JSON document for scripts."""
    spec = lane_spec(f"obs-cli-{unique}")
    group = f"g-{unique}"
    settings = settings_for(transport="redis")

    async def setup() -> None:
        transport = create_transport(settings)
        try:
            async with partly_consumed(transport, spec, group, produced=2, committed=1):
                pass
        finally:
            await transport.close()

    async def teardown() -> None:
        transport = create_transport(settings)
        try:
            await drop(transport, spec)
        finally:
            await transport.close()

    asyncio.run(setup())
    try:
        monkeypatch.setenv("PIPELINE_TOPICS_DIR", str(write_spec(tmp_path / "topics", spec)))
        monkeypatch.setenv("PIPELINE_REDIS__URL", settings.redis.url)
        result = CliRunner().invoke(
            cli, ["status", "--json", "--group", group, "--no-log", "-t", "redis"]
        )
    finally:
        asyncio.run(teardown())
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [(lane["lane"], lane["group"], lane["lag"]) for lane in document["lanes"]] == [
        (spec.lane, group, 1)
    ]


def test_every_column_of_a_lane_with_figures_shows_one():
    """A lane whose every figure is known fills every column: none is a placeholder nobody fills."""
    report = LaneReport("messages", "g", 3, 5.0, {"5s": 1}, 2)
    status = Status("redis", (LaneStatus(report, throttled=(("acme", 4),)),))
    console = Console(record=True, width=200)
    render(status, console)
    (lane_row,) = [line for line in console.export_text().splitlines() if "messages" in line]
    cells = [cell.strip() for cell in lane_row.strip("│ ").split("│")]
    assert cells == ["messages", "g", "3", "5.0s", "5s:1", "2", "acme (4)"]


def test_the_oldest_of_a_lane_of_long_work_is_not_shown_as_a_page() -> None:
    """A long-work lane's old message is marked as likely running, not painted as overdue."""
    reports = (LaneReport("scans", "g", 1, 720.0, {}, 0), LaneReport("hooks", "g", 1, 720.0, {}, 0))
    status = Status("redis", (LaneStatus(reports[0], long_work=True), LaneStatus(reports[1])))
    console = Console(record=True, width=200, force_terminal=True, color_system="standard")
    render(status, console)
    lines = console.export_text(styles=True, clear=False).splitlines()
    (scans,) = [line for line in lines if "scans" in line and "│" in line]
    (hooks,) = [line for line in lines if "hooks" in line and "│" in line]
    assert "12.0m*" in scans
    assert "\x1b[31m" not in scans
    assert "\x1b[31m" in hooks  # a waiting message this old pages
    text = console.export_text()
    assert "* a lane of long work" in text
    assert json.loads(json.dumps(status.to_json()))["lanes"][0]["long_work"] is True
