"""The ingress's text log line of a refused webhook names its source and the reason."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from ingress.helpers import META, build, client, meta_body
from ingress.signing import hub_signature

from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.tracing.logs import TextFormatter

TOPICS = {"messages": "messages", "engagement": "engagement"}


async def test_a_rejected_webhook_line_names_source_and_reason(
    tmp_path: Path, sqlite_store: SqliteLogStore, caplog: pytest.LogCaptureFixture
) -> None:
    """At INFO, the text line says which source refused the request and why, not only that."""
    _, http = client(build(tmp_path, {"whatsapp": META}, TOPICS), sqlite_store)
    body = meta_body(1)
    headers = {"x-hub-signature-256": hub_signature("another-secret", body)}
    caplog.set_level(logging.INFO, logger="pipeline.ingress.app")
    async with http:
        assert (
            await http.post("/hooks/whatsapp", content=body, headers=headers)
        ).status_code == 401
    (record,) = [r for r in caplog.records if r.getMessage().startswith("webhook rejected")]
    line = TextFormatter().format(record)
    assert line.endswith(
        f" INFO pipeline.ingress.app webhook rejected from source whatsapp: {record.reason}"
    ), line
    assert record.reason
    assert record.source == "whatsapp"  # the JSON log's fields stay
