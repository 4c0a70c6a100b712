"""`pipeline status` read for a group that does not exist says so, and who reads the lane.

Without ``--group`` status reads a group named after each lane. A lane consumed under another
name (``pipeline consume ... --group replies``) then showed a lag counting every message the
topics hold, as if a real group were that far behind.
"""

from __future__ import annotations

import json

from lane_support import lane_spec
from rich.console import Console
from test_status import partly_consumed_status

from pipeline.cli.status_view import render


async def test_a_lane_read_for_no_group_shows_no_figures_and_names_its_readers(
    transport, unique, tmp_path
):
    """5 messages, 2 committed by group g-<unique>; status without --group: no lag of 5."""
    spec = lane_spec(f"obs-nogroup-{unique}")
    group = f"g-{unique}"
    # no --group: the group named after the lane
    status = await partly_consumed_status(transport, spec, group, [], tmp_path)
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
    status = await partly_consumed_status(transport, spec, group, [group], tmp_path)
    (lane,) = status.lanes
    assert (lane.no_group, lane.report.lag) == (False, 3)
    assert status.to_json()["lanes"][0]["group_exists"] is True
