"""An AsyncAPI document diffs cleanly between two versions of the declarations.

A developer keeps ``pipeline asyncapi`` output next to the code and diffs it when a lane
changes. YAML anchors (``&id026`` ... ``*id026``), which PyYAML writes for every object the
document holds twice, are numbered in document order: a lane added ahead renumbered the anchors
of every lane after it, so the diff showed lanes that had not changed.
"""

from __future__ import annotations

import difflib
from typing import Any

import yaml
from pydantic import BaseModel

from pipeline.topics.asyncapi import document
from pipeline.topics.spec import TopicSpec


class Audit(BaseModel):
    """The event of the lane added first in the alphabet."""

    who: str


class Order(BaseModel):
    """The event of an ordered lane with tiers."""

    order_id: str
    amount: int


class Note(BaseModel):
    """An item of a debounced lane's turn."""

    user_id: str
    text: str


def spec(name: str, **fields: Any) -> TopicSpec:
    """A declaration of ``name``."""
    return TopicSpec.model_validate({"name": name, **fields})


ORDERS = spec("orders", partitions=4, retry={"tiers": ["5s", "1m"]})
NOTES = spec("notes", partitions=1, debounce={"key": "user_id", "quiet_s": 3, "max_wait_s": 20})


def as_yaml(specs: list[TopicSpec], models: dict[str, type[BaseModel]]) -> list[str]:
    """The document's lines as ``pipeline asyncapi`` prints them (``yaml.safe_dump``)."""
    doc = document(
        specs, kafka_bootstrap="127.0.0.1:9092", redis_url="redis://127.0.0.1:6379/0", models=models
    )
    dumped: str = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    return dumped.splitlines()


def test_a_lane_added_ahead_changes_no_line_of_the_others() -> None:
    """Every line the diff removes or adds belongs to the new lane, its model or its schema."""
    models: dict[str, type[BaseModel]] = {"orders": Order, "notes": Note}
    before = as_yaml([ORDERS, NOTES], models)
    after = as_yaml([spec("audit", partitions=1), ORDERS, NOTES], {**models, "audit": Audit})
    removed = [line for line in difflib.ndiff(before, after) if line.startswith("- ")]
    assert removed == []
    assert not [line for line in after if "&id" in line or "*id" in line]


def test_a_document_holds_no_object_twice() -> None:
    """Changing one message's headers in a document changes nothing else, nor the next one."""
    first = document([ORDERS], kafka_bootstrap="k:9092", redis_url="redis://r:6379/0")
    first["components"]["schemas"]["EventHeaders"]["properties"].clear()
    first["components"]["messages"]["orders_event"]["bindings"]["kafka"]["key"]["type"] = "x"
    second = document([ORDERS], kafka_bootstrap="k:9092", redis_url="redis://r:6379/0")
    assert second["components"]["schemas"]["EventHeaders"]["properties"]
    assert first["components"]["schemas"]["RetryHeaders"]["properties"]


def test_one_partition_is_said_in_the_singular() -> None:
    """``Lane `notes`: 1 partition``, not ``1 partitions``."""
    doc = document([NOTES], kafka_bootstrap="k:9092", redis_url="redis://r:6379/0")
    assert doc["channels"]["notes"]["description"].startswith("Lane `notes`: 1 partition, keyed")
