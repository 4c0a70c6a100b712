"""`pipeline status` read for a group that does not exist says so, and who reads the lane.

Without ``--group`` status reads a group named after each lane. A lane consumed under another
name (``pipeline consume ... --group replies``) then showed a lag counting every message the
topics hold, as if a real group were that far behind.
"""

from __future__ import annotations

import json

from lane_support import drop, lane_spec, partly_consumed
from rich.console import Console
from support import test_settings as settings_for
from test_status import write_spec

from pipeline.cli.status_view import gather, render


async def test_a_lane_read_for_no_group_shows_no_figures_and_names_its_readers(
    transport, unique, tmp_path
):
    """5 messages, 2 committed by group g-<unique>; status without --group: no lag of 5."""
    spec = lane_spec(f"obs-nogroup-{unique}")
    group = f"g-{unique}"
    settings = settings_for(
        topics_dir=write_spec(tmp_path / "topics", spec), transport=transport.name
    )
    try:
        async with partly_consumed(transport, spec, group, produced=5, committed=2):
            status = await gather(settings, [], with_log=False)  # the group named after the lane
    finally:
        await drop(transport, spec)
    (lane,) = status.lanes
    assert (lane.report.lane, lane.report.group) == (spec.lane, spec.lane)
    assert lane.no_group, lane
    assert lane.readers == (group,)
    lanes = json.loads(json.dumps(status.to_json()))["lanes"]
    assert [(d["lag"], d["group_exists"], d["groups_reading"]) for d in lanes] == [
        (None, False, [group])
    ]
    console = Console(record=True, width=200)
    render(status, console)
    text = console.export_text()
    assert f"no consumer group {spec.lane!r} exists (groups reading it: {group})" in text
    assert " 5 " not in text.split("\n", 3)[3]  # no lag figure in the lane's row


async def test_an_existing_group_keeps_its_figures(transport, unique, tmp_path):
    """``--group`` naming the group that read the lane: its lag as before, nothing said."""
    spec = lane_spec(f"obs-hasgroup-{unique}")
    group = f"g-{unique}"
    settings = settings_for(
        topics_dir=write_spec(tmp_path / "topics", spec), transport=transport.name
    )
    try:
        async with partly_consumed(transport, spec, group, produced=5, committed=2):
            status = await gather(settings, [group], with_log=False)
    finally:
        await drop(transport, spec)
    (lane,) = status.lanes
    assert (lane.no_group, lane.report.lag) == (False, 3)
    assert status.to_json()["lanes"][0]["group_exists"] is True
