"""Our Avro serializer given a value nested past Python's recursion limit: one SerdeError.

A recursive schema (a node holding an optional node) admits values of any depth; fastavro's
validation recurses per level, so a value 5,000 deep raised RecursionError out of ``serialize``
where every other value that does not fit is a :class:`SerdeError` naming the subject.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.registry.client.http import RegistryClient
from pipeline.registry.client.serde import AvroSerializer
from pipeline.registry.errors import SerdeError

NODE = json.dumps(
    {
        "type": "record",
        "name": "Node",
        "fields": [{"name": "next", "type": ["null", "Node"], "default": None}],
    }
)


def test_a_value_nested_past_the_recursion_limit_is_a_serde_error(
    ours: RegistryClient, unique: str
) -> None:
    """5,000 levels of an optional node: a SerdeError naming the subject, not RecursionError."""
    serializer = AvroSerializer(ours, NODE, f"deep-{unique}-value")
    value: dict[str, Any] = {"next": None}
    assert serializer(value)  # a shallow one is written
    for _ in range(5_000):
        value = {"next": value}
    with pytest.raises(SerdeError, match="does not fit the schema"):
        serializer(value)
