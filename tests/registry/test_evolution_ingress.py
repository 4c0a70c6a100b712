"""Schema evolution at the ingress door: a lane's subject gains a version while it runs."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from pipeline.ingress.errors import SchemaMismatch
from pipeline.ingress.schemas import LaneSchemas
from pipeline.registry.client.http import RegistryClient


def _doc(*fields: dict[str, Any]) -> str:
    base = [{"name": "n", "type": "int"}]
    return json.dumps(
        {"type": "record", "name": "Doc", "namespace": "t", "fields": base + list(fields)}
    )


async def test_a_new_version_with_binary_fields_still_admits_json_payloads(
    sqlite_registry_url: str,
) -> None:
    """A v2 adding bytes and fixed fields (strings in JSON) does not refuse every payload."""
    subject = f"doc-{uuid.uuid4().hex}-value"
    client = RegistryClient(sqlite_registry_url)
    client.register(subject, _doc())
    schemas = LaneSchemas(client, {"docs": subject})
    await schemas.start()
    try:
        schemas.check("docs", b'{"n": 1}')
        client.register(
            subject,
            _doc(
                {"name": "raw", "type": "bytes", "default": "\u00ff"},
                {
                    "name": "tag",
                    "type": {"type": "fixed", "name": "Tag", "size": 2},
                    "default": "ab",
                },
                {"name": "again", "type": ["null", "Tag"], "default": None},
            ),
        )
        await schemas.refresh()
        schemas.check("docs", b'{"n": 1}')
        schemas.check("docs", b'{"n": 1, "raw": "abc", "tag": "xy", "again": "zz"}')
        with pytest.raises(SchemaMismatch) as refused:
            schemas.check("docs", b'{"n": 1, "raw": 5}')
        assert "t.Doc.raw" in refused.value.detail
    finally:
        await schemas.close()
        client.close()
