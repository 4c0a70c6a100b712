"""The line for dead letters left in a lane's former dead-letter topic agrees with their count."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.topics.admin import hazards
from pipeline.topics.spec import load_specs
from pipeline.transport.protocol import TopicInfo


@pytest.mark.parametrize(
    ("counts", "says"),
    [
        ((1, 0), "the 1 message in m.dlq stays there: redrive it from m.dlq (pipeline redrive)"),
        ((2, 1), "the 3 messages in m.dlq stay there: redrive them from m.dlq (pipeline redrive)"),
    ],
)
def test_dead_letters_left_behind_are_named_with_their_count(
    tmp_path: Path, counts: tuple[int, ...], says: str
) -> None:
    """One dead letter stays, several stay: the verb and the pronoun follow the count."""
    (tmp_path / "m.yaml").write_text("name: m\npartitions: 1\nlane: m\ndead_letter: m.dead\n")
    specs = load_specs(tmp_path)
    existing = {
        "m": TopicInfo("m", 1, None, (0,)),
        "m.dlq": TopicInfo("m.dlq", 2, None, counts),
    }
    lines = hazards(specs, existing, default_max_len=1000)
    assert [line for line in lines if "m.dlq" in line] == [
        f"lane 'm': dead letters now go to m.dead; {says}"
    ]
