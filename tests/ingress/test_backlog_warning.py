"""The sweeper's warning for a lane without a consumer group names the variable to set."""

from __future__ import annotations

import json
import logging
import re

import pytest

from pipeline.config import load_settings
from pipeline.ingress.backlog import GroupLagBacklog
from pipeline.transport.protocol import Transport


async def test_a_lane_without_a_group_names_the_variable_that_gives_it_one(
    streams: Transport,
    unique: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lane counts as backed up, and the line names PIPELINE_INGRESS__SWEEPER__LANE_GROUPS."""
    lane = f"lane_{unique}"
    backlog = GroupLagBacklog(streams.admin(), {lane: [lane]}, {})
    caplog.set_level(logging.WARNING, logger="pipeline.ingress.backlog")
    assert await backlog.is_backlogged(lane)
    (line,) = [r.getMessage() for r in caplog.records]
    variable = "PIPELINE_INGRESS__SWEEPER__LANE_GROUPS"
    assert line.startswith(f"lane {lane} counts as backed up: "), line
    assert variable in line
    assert "sweeper.lane_groups" not in line
    found = re.search(f"{variable}, .*'([^']*)'", line)
    assert found is not None, line
    example = found.group(1)
    monkeypatch.setenv(variable, example)  # the example it gives is a value the setting takes
    assert load_settings().ingress.sweeper.lane_groups == json.loads(example)
