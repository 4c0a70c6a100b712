"""The line for spans dropped at exit names the collector without the password in its URL."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from pipeline.tracing.export import _Exiting


def test_the_dropped_spans_line_hides_the_endpoints_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A collector endpoint with user:password@ is named as user:***@ in the exit line."""
    exporter = OTLPSpanExporter(endpoint="http://spans:Otlp-Sesame@127.0.0.1:1/v1/traces")
    exiting = _Exiting(exporter)
    exiting.ending = True
    exiting.sent(SpanExportResult.FAILURE, 3)
    with caplog.at_level(logging.WARNING, logger="pipeline.tracing.export"):
        exiting.report()
    (line,) = [r.getMessage() for r in caplog.records]
    assert "Otlp-Sesame" not in line
    assert "3 spans not exported at exit: the collector at http://spans:***@127.0.0.1:1" in line
    exporter.shutdown()  # type: ignore[no-untyped-call]
