"""Log records carry the current trace and span ids; PIPELINE_LOG_FORMAT=json writes JSON lines."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tracing.otlp_receiver import OtlpReceiver

from pipeline import tracing
from pipeline.tracing.logs import JsonFormatter, TextFormatter, TraceFilter

ROOT = Path(__file__).parents[2]


def _record(message: str, **extra: object) -> logging.LogRecord:
    record = logging.makeLogRecord({"name": "pipeline.test", "levelname": "INFO", "msg": message})
    record.__dict__.update(extra)
    return record


@pytest.mark.usefixtures("traced")
def test_a_record_inside_a_span_names_its_trace_and_span() -> None:
    """Inside a span the filter adds its ids, and the JSON line carries them and the extras."""
    with tracing.stage("verify") as context:
        record = _record("webhook rejected", source="whatsapp")
        assert TraceFilter().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert line["trace_id"] == format(context.trace_id, "032x")
    assert line["span_id"] == format(context.span_id, "016x")
    assert (line["level"], line["logger"], line["message"]) == (
        "INFO",
        "pipeline.test",
        "webhook rejected",
    )
    assert line["source"] == "whatsapp"


def test_with_tracing_off_the_ids_are_empty() -> None:
    """Outside tracing the fields exist and are empty, and the text line is as it always was."""
    record = _record("hello")
    TraceFilter().filter(record)
    assert (record.trace_id, record.span_id) == ("", "")
    assert TextFormatter().format(record).endswith(" INFO pipeline.test hello")


@pytest.mark.usefixtures("traced")
def test_a_text_line_inside_a_span_ends_with_its_ids() -> None:
    """The plain format names the trace and span of a record logged inside one."""
    with tracing.stage("log commit") as context:
        record = _record("log store insert failed")
        TraceFilter().filter(record)
    line = TextFormatter().format(record)
    trace_id, span_id = format(context.trace_id, "032x"), format(context.span_id, "016x")
    assert line.endswith(f"log store insert failed trace={trace_id} span={span_id}")


def test_the_cli_logs_json_lines_when_asked() -> None:
    """PIPELINE_LOG_FORMAT=json makes every log line of the CLI one JSON object."""
    code = (
        "import logging, sys\n"
        "sys.argv = ['pipeline', '--help']\n"
        "from pipeline.cli import commands as cli\n"
        "cli.app = lambda: logging.getLogger('pipeline.test').warning('broker %s down', 'b1')\n"
        "cli.main()\n"
    )
    env = {**os.environ, "PIPELINE_LOG_FORMAT": "json"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    (line,) = out.stderr.strip().splitlines()
    doc = json.loads(line)
    assert (doc["level"], doc["message"], doc["trace_id"]) == ("WARNING", "broker b1 down", "")


_EXPORT_REFUSED = """
import os
from pipeline import tracing
from pipeline.log_repeats import configure_logging
configure_logging("WARNING", "json")
assert tracing.configure(os.environ, service="pipeline-test")
with tracing.stage("verify"):
    pass
tracing.shutdown()
"""


def test_the_exporting_process_logs_in_the_format_asked_for(otlp: OtlpReceiver) -> None:
    """Its failed exports (a collector answering 404) are JSON lines too, like the traced one's."""
    env = {
        **os.environ,
        "PIPELINE_LOG_FORMAT": "json",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp.endpoint.replace("/v1/traces", "/v1/nowhere"),
        "OTEL_TRACES_SAMPLER": "always_on",
    }
    out = subprocess.run(
        [sys.executable, "-c", _EXPORT_REFUSED],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = out.stderr.strip().splitlines()
    assert lines, "the failed export is logged"
    docs = [json.loads(line) for line in lines]
    assert any("404" in doc["message"] and doc["level"] == "ERROR" for doc in docs), docs


def _strict(line: str) -> dict[str, object]:
    """``line`` parsed as RFC 8259 JSON (no NaN or Infinity, which JSON does not have)."""

    def refuse(constant: str) -> object:
        raise ValueError(f"not JSON: {constant}")

    doc = json.loads(line, parse_constant=refuse)
    assert isinstance(doc, dict)
    return doc


def test_a_json_line_stays_json_whatever_the_extras_hold() -> None:
    """NaN, infinity, a dict keyed by tuples and a list holding itself still make one JSON line.

    Each such value is written as its text; the other fields are kept as they are.
    """
    looped: list[object] = []
    looped.append(looped)
    extras = {
        "lag_s": float("nan"),
        "rate": float("inf"),
        "by_pair": {("a", "b"): 1},
        "looped": looped,
    }
    for name, value in extras.items():
        record = _record("progress", **{name: value, "lane": "messages"})
        line = JsonFormatter().format(record)
        assert "\n" not in line
        doc = _strict(line)
        assert (doc["message"], doc["lane"], doc[name]) == ("progress", "messages", str(value))


_WORKER_LINES = """
import logging, sys
from pipeline.log_repeats import configure_logging
configure_logging("INFO", sys.argv[1], worker=2)
logging.getLogger("pipeline.transport.kafka").info("broker %s down", "b1")
"""


def test_an_ingress_workers_lines_name_the_worker() -> None:
    """Each worker process of ``--workers N`` logs its index, in either format."""
    lines: dict[str, str] = {}
    for fmt in ("text", "json"):
        out = subprocess.run(
            [sys.executable, "-c", _WORKER_LINES, fmt],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        (lines[fmt],) = out.stderr.strip().splitlines()
    assert lines["text"].endswith(" pipeline.transport.kafka broker b1 down worker=2")
    assert json.loads(lines["json"])["worker"] == 2


def test_a_line_outside_a_worker_names_none() -> None:
    """A process that is no ingress worker logs as it always did."""
    record = logging.makeLogRecord({"name": "pipeline.test", "msg": "hello", "levelname": "INFO"})
    assert "worker" not in TextFormatter().format(record)
    assert "worker" not in json.loads(JsonFormatter().format(record))


_UVICORN_LINE = """
import logging
from starlette.applications import Starlette
from pipeline.log_repeats import configure_logging
from pipeline.registry.server.serve import uvicorn_config
configure_logging("WARNING", "json", worker=1)
uvicorn_config(Starlette(), "127.0.0.1", 0)  # uvicorn sets its loggers up here
logging.getLogger("uvicorn.error").warning("graceful shutdown exceeded")
"""


def test_the_http_servers_own_lines_are_in_the_process_format() -> None:
    """The HTTP server's loggers propagate: its lines are JSON with the process's fields.

    With uvicorn's default logging config its lines came out as ``WARNING:  ...`` on a handler
    of its own: neither JSON nor the worker's index, trace ids or the repeat backoff.
    """
    out = subprocess.run(
        [sys.executable, "-c", _UVICORN_LINE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    (line,) = out.stderr.strip().splitlines()
    doc = json.loads(line)
    assert (doc["logger"], doc["message"], doc["worker"]) == (
        "uvicorn.error",
        "graceful shutdown exceeded",
        1,
    )
