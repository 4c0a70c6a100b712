"""Tracing is off unless the OTEL_* variables ask for it, and then costs no SDK and no objects."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tracing.otlp_receiver import OtlpReceiver

from pipeline import tracing
from pipeline.envelope import Message
from pipeline.tracing import setup
from pipeline.tracing.setup import wanted

ROOT = Path(__file__).parents[2]
ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_only_an_endpoint_turns_tracing_on() -> None:
    """An endpoint turns it on; OTEL_SDK_DISABLED or OTEL_TRACES_EXPORTER=none keep it off."""
    assert not wanted({})
    assert wanted(ENDPOINT)
    assert wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert not wanted({**ENDPOINT, "OTEL_SDK_DISABLED": "true"})
    assert not wanted({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"})


def test_off_the_helpers_hand_back_shared_no_ops() -> None:
    """With tracing off every helper returns a shared no-op or its input: nothing per message."""
    assert not tracing.configure({}, service="pipeline-test")
    message = Message(
        "t", 0, 1, b"k", b"v", {"traceparent": b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"}
    )
    assert tracing.process(message, "lane") is None
    assert tracing.stage("verify") is tracing.stage("log commit")
    assert tracing.webhook("s", {}) is tracing.stage("verify")
    headers = {"a": "b"}
    assert tracing.outgoing(headers) is headers
    assert tracing.sends_started("t", []) is None


def test_importing_the_pipeline_with_tracing_off_imports_no_sdk() -> None:
    """The CLI, the member and the ingress load no trace SDK and no exporter when it is off.

    (redis-py imports ``opentelemetry.sdk.metrics`` by itself when the SDK is installed.)
    """
    code = (
        "import os, sys, json\n"
        "import pipeline.cli, pipeline.runtime.member, pipeline.ingress.service\n"
        "from pipeline import tracing\n"
        "tracing.configure(os.environ, service='x')\n"
        "ours = ('opentelemetry.sdk.trace', 'opentelemetry.exporter')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(ours))))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


def test_an_endpoint_without_the_sdk_is_one_line_and_exit_2() -> None:
    """Asking for traces without pipeline[otel] installed stops the CLI with one line."""
    code = (
        "import sys\n"
        "sys.modules['opentelemetry.sdk'] = None\n"  # as if the extra were not installed
        "sys.argv = ['pipeline', 'topics', 'list']\n"
        "from pipeline.cli import main\n"
        "main()\n"
    )
    env = {**os.environ, **ENDPOINT, "COLUMNS": "200"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed" in line
    assert "pipeline[otel]" in line


@pytest.mark.parametrize(
    "variable", ["OTEL_SPAN_EVENT_COUNT_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"]
)
def test_a_malformed_span_limit_is_one_line_and_exit_2(variable: str) -> None:
    """A span limit variable that is not a number stops the CLI with one line naming it."""
    env = {**os.environ, **ENDPOINT, variable: "many", "COLUMNS": "200"}
    code = (
        "import sys\n"
        "sys.argv = ['pipeline', 'topics', 'list']\n"
        "from pipeline.cli import main\n"
        "main()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert variable in line
    assert "many" in line


@pytest.mark.parametrize(
    ("service_name", "expected"),
    [(None, "orders-consumer"), ("orders-v2", "orders-v2")],
    ids=["resource attributes", "service name first"],
)
def test_the_service_name_of_otel_resource_attributes_is_kept(
    otlp: OtlpReceiver,
    monkeypatch: pytest.MonkeyPatch,
    service_name: str | None,
    expected: str,
) -> None:
    """``service.name`` in OTEL_RESOURCE_ATTRIBUTES names the service; OTEL_SERVICE_NAME wins.

    The command's own name (``pipeline-<command>``) is the default only when neither sets one;
    the other resource attributes are kept either way.
    """
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp.endpoint)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "service.name=orders-consumer,deployment.environment=prod"
    )
    if service_name is None:
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    else:
        monkeypatch.setenv("OTEL_SERVICE_NAME", service_name)
    assert tracing.configure(os.environ, service="pipeline-consume")
    try:
        with tracing.stage("verify"):
            pass
    finally:
        tracing.shutdown()
    (span,) = otlp.spans
    assert span.service == expected
    (body,) = otlp.bodies
    assert b"deployment.environment" in body


@pytest.mark.usefixtures("traced")
def test_configure_twice_replaces_the_provider() -> None:
    """Configuring again (a second command in one process) leaves one working tracer."""
    assert tracing.on()
    assert tracing.configure({**os.environ}, service="pipeline-test")
    assert tracing.on()


def test_an_unsampled_traceparent_records_nothing_under_a_parent_based_sampler(
    otlp: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delivery whose traceparent says "not sampled" opens no span, and its copies keep it."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp.endpoint)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
    assert tracing.configure(os.environ, service="pipeline-test")
    try:
        unsampled = b"00-" + b"3" * 32 + b"-" + b"4" * 16 + b"-00"
        sampled = unsampled[:-2] + b"01"
        assert (
            tracing.process(Message("t", 0, 1, b"k", b"v", {"traceparent": unsampled}), "l") is None
        )
        delivery = tracing.process(Message("t", 0, 2, b"k", b"v", {"traceparent": sampled}), "l")
        assert delivery is not None
        tracing.finish(delivery, "handled")
        copy = {"traceparent": unsampled}
        with tracing.sending("t.retry.5s", copy, "retry"):
            pass
        assert copy == {"traceparent": unsampled}
    finally:
        tracing.shutdown()
    assert [s.name for trace in otlp.traces().values() for s in trace] == [
        "partition wait",
        "process t",
    ]


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's idle scheduling class")
def test_the_exporting_process_runs_only_on_idle_cpu(traced: OtlpReceiver) -> None:
    """The exporter is in the idle scheduling class: it never takes a core the pipeline wants."""
    shipper = setup._shipper
    assert shipper is not None
    assert os.sched_getscheduler(shipper._process.pid) == os.SCHED_IDLE


def test_the_exporting_session_reads_the_environment_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The proxies and CA bundle requests takes from the environment, the same, read once.

    With a credential provider's variable set the SDK's own session stays (None here).
    """
    import requests  # noqa: PLC0415 - with the otel extra

    from pipeline.tracing.export import _session  # noqa: PLC0415

    url = "https://collector.example:4318/v1/traces"
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/collector.pem")
    session = _session(os.environ)
    assert session is not None
    settings = session.merge_environment_settings(url, {}, None, verify=True, cert=None)
    expected = requests.Session().merge_environment_settings(url, {}, None, verify=True, cert=None)
    assert settings == expected
    assert settings["verify"] == "/etc/ssl/collector.pem"
    assert settings["proxies"]["https"] == "http://proxy.example:3128"
    monkeypatch.setenv("HTTPS_PROXY", "http://elsewhere.example:3128")
    assert session.merge_environment_settings(url, {}, None, verify=True, cert=None) == expected
    own = session.merge_environment_settings(url, {"https": "http://own:1"}, None, None, None)
    assert own["proxies"]["https"] == "http://own:1"
    environ = {"OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER": "vault"}
    assert _session(environ) is None


_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


def _exporter_and_session() -> tuple[Any, Any]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )

    from pipeline.tracing.export import _session  # noqa: PLC0415

    session = _session(os.environ)
    return OTLPSpanExporter(session=session), session


def _no_proxy_or_netrc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No proxy variables; ``NETRC`` names a file that does not exist yet (returned)."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    return tmp_path / "netrc"


def _one_delivery() -> tuple[Any, list[Any]]:
    """The service's resource and the encoded spans of one handled delivery."""
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415

    from pipeline.tracing.export import WireSpans  # noqa: PLC0415

    t0 = 1_764_590_000_000_000_000
    delivery = (
        *("d", TRACEPARENT, t0 - 5_000, t0, 0, None, 0, 0, t0 + 4_000, t0 + 20_000),
        *(t0 + 5_000, t0 + 9_000, None, t0 + 30_000, "kafka", "orders", 3, 41, "orders", ""),
        *(None, 1, b"tenant-a", b"key-1", "handled", None, None),
    )
    resource = Resource.create({"service.name": "pipeline-test"})
    return resource, list(WireSpans(resource).of(delivery))


def _export(exporter: Any) -> Any:
    """Send the spans of one delivery through ``exporter``'s client; its result."""
    from pipeline.tracing import otlp as wire  # noqa: PLC0415
    from pipeline.tracing.export import SCOPE, _raw_sender  # noqa: PLC0415

    resource, spans = _one_delivery()
    return _raw_sender(exporter)(wire.request(resource.attributes, SCOPE, spans))


def test_spans_leave_over_a_kept_connection_to_a_plain_http_collector(
    otlp: OtlpReceiver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A kept ``http.client`` connection sends, compressed as configured, to a real receiver.

    A collector that is down fails the export (the SDK logs it) and nothing raises.
    """
    from pipeline.tracing.export import lean_transport  # noqa: PLC0415
    from pipeline.tracing.plain_http import PlainHTTPTransport  # noqa: PLC0415

    _no_proxy_or_netrc(monkeypatch, tmp_path)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-collector-tenant=acme")
    exporter, session = _exporter_and_session()
    assert lean_transport(exporter, session)
    assert isinstance(exporter._client._transport, PlainHTTPTransport)
    assert _export(exporter).success
    assert [s.name for s in otlp.spans] == ["partition wait", "process orders", "guard", "handler"]
    assert {s.trace_id for s in otlp.spans} == {TRACEPARENT[3:35].decode()}
    (headers,) = otlp.headers
    assert headers["content-encoding"] == "gzip"
    assert headers["x-collector-tenant"] == "acme"
    assert headers["content-type"] == "application/x-protobuf"
    exporter.shutdown()  # closes the kept connection

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{port}/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    exporter, session = _exporter_and_session()
    assert lean_transport(exporter, session)
    assert _export(exporter).success is False


def test_requests_stays_where_it_adds_something(
    otlp: OtlpReceiver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A ``.netrc`` entry, a user and password in the URL, a proxy or a credential provider.

    ``requests`` uses each (the URL's user and password arrive as Basic auth), so the
    exporter's own transport is kept.
    """
    from pipeline.tracing.export import lean_transport  # noqa: PLC0415

    netrc = _no_proxy_or_netrc(monkeypatch, tmp_path)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp.endpoint)
    netrc.write_text("machine 127.0.0.1 login pipeline password secret\n")
    exporter, session = _exporter_and_session()
    assert not lean_transport(exporter, session)
    netrc.unlink()

    with_user = otlp.endpoint.replace("http://", "http://pipeline:secret@")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", with_user)
    exporter, session = _exporter_and_session()
    assert not lean_transport(exporter, session)
    assert _export(exporter).success
    assert otlp.headers[-1]["authorization"] == "Basic cGlwZWxpbmU6c2VjcmV0"

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp.endpoint)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    exporter, session = _exporter_and_session()
    transport = exporter._client._transport
    assert not lean_transport(exporter, session)
    assert exporter._client._transport is transport  # the SDK's requests transport
    assert not lean_transport(exporter, None)  # a credential provider's session: the SDK's


def test_a_tls_endpoint_is_sent_to_through_the_sdks_urllib3_transport(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``https://``: the SDK's urllib3 transport, with the CA bundle ``requests`` would use."""
    from opentelemetry.exporter.http.transport._urllib3 import (  # noqa: PLC0415
        Urllib3HTTPTransport,
    )

    from pipeline.tracing.export import lean_transport  # noqa: PLC0415

    _no_proxy_or_netrc(monkeypatch, tmp_path)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "collector-ca.pem"))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://collector.example/v1/traces")
    exporter, session = _exporter_and_session()
    assert lean_transport(exporter, session)
    transport = exporter._client._transport
    assert isinstance(transport, Urllib3HTTPTransport)
    assert transport._pool.connection_pool_kw["ca_certs"] == str(tmp_path / "collector-ca.pem")
    exporter.shutdown()


def test_an_exporting_process_that_dies_costs_one_warning_and_nothing_else(
    traced: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """Killed under the traced process: its records are dropped, the stages never see it.

    The hooks keep working, the shutdown does not wait for the dead process, and the loss is
    said once.
    """
    shipper = setup._shipper
    assert shipper is not None
    shipper._process.kill()
    shipper._process.wait()
    message = Message("t", 0, 1, b"k", b"v", {"traceparent": TRACEPARENT}, 1)
    for offset in range(2_000):  # several batches: the thread writes some, the shutdown the rest
        delivery = tracing.process(message, "lane")
        assert delivery is not None
        tracing.guard_left(delivery, tracing.guard_entered(delivery))
        tracing.finish(delivery, "handled" if offset % 2 else "retried")
    tracing.shutdown()
    lost = [r for r in caplog.records if "exporting process exited" in r.getMessage()]
    assert len(lost) == 1
    assert lost[0].levelname == "WARNING"
    assert traced.spans == []
    assert not tracing.on()


_STOPPED_BY_ITS_GROUP = """
import os, signal, sys
from pipeline import tracing
from pipeline.envelope import Message
assert tracing.configure(os.environ, service="pipeline-test")  # starts the exporting process
# From now on (not in the exporting process, started already) SIGTERM only writes a byte to the
# pipe read below, whichever thread it reaches: no race between a check and a wait.
woken, wake = os.pipe()
os.set_blocking(wake, False)
signal.signal(signal.SIGTERM, lambda *_: None)
signal.set_wakeup_fd(wake)
message = Message("t", 0, 1, b"k", b"v", {"traceparent": sys.argv[1].encode()}, 1)
for offset in range(int(sys.argv[2])):
    message.offset = offset
    delivery = tracing.process(message, "lane")
    tracing.guard_left(delivery, tracing.guard_entered(delivery))
    tracing.finish(delivery, "handled")
print("recorded", flush=True)
os.read(woken, 1)
tracing.shutdown()
"""


def test_a_service_manager_stopping_the_whole_group_loses_no_span(otlp: OtlpReceiver) -> None:
    """SIGTERM to the traced process's group (systemd's default, ``kill -TERM -PGID``).

    The exporting process is in that group too. It stays until its input closes, so what the
    traced process hands it while stopping is still exported.
    """
    n = 300  # fewer than a batch: they wait in the traced process until it stops
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp.endpoint,
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_BSP_SCHEDULE_DELAY": "60000",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", _STOPPED_BY_ITS_GROUP, TRACEPARENT.decode(), str(n)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=ROOT,
        start_new_session=True,  # its own group, as under a service manager
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"recorded\n"
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    processed = [span for span in otlp.spans if span.name == "process t"]
    assert len(processed) == n


_RECORDS_AND_EXITS = """
import os, sys
from pipeline import tracing
from pipeline.envelope import Message
assert tracing.configure(os.environ, service="pipeline-test")
message = Message("t", 0, 1, b"k", b"v", {"traceparent": sys.argv[1].encode()}, 1)
for offset in range(int(sys.argv[2])):
    message.offset = offset
    delivery = tracing.process(message, "lane")
    tracing.guard_left(delivery, tracing.guard_entered(delivery))
    tracing.finish(delivery, "handled")
"""


def test_a_collector_that_is_down_at_exit_costs_one_attempt_and_one_line() -> None:
    """At exit a collector that drops every connection is tried once, not once a batch with backoff.

    The spans it did not take are dropped and counted in one line naming the collector, so a
    fleet restarting during a collector outage is not held up by retries at every exit.
    """
    attempts: list[int] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)

    def drop_every_connection() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            attempts.append(1)
            connection.close()  # closed before any answer: a connection error, retried

    thread = threading.Thread(target=drop_every_connection, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    n = 400  # 1,200 spans (partition wait, process, guard): three requests of 512
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{port}/v1/traces",
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "3",
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_BSP_SCHEDULE_DELAY": "60000",
        "PIPELINE_LOG_FORMAT": "text",
        "PIPELINE_LOG_LEVEL": "WARNING",
    }
    try:
        out = subprocess.run(
            [sys.executable, "-c", _RECORDS_AND_EXITS, TRACEPARENT.decode(), str(n)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        listener.close()
        thread.join()
    assert out.returncode == 0, out.stderr
    assert len(attempts) <= 2  # one request, and the client's immediate reconnect
    (line,) = [line for line in out.stderr.splitlines() if "not exported" in line]
    assert f"{3 * n} spans not exported" in line
    assert f"127.0.0.1:{port}" in line
    assert "Traceback" not in out.stderr


def test_the_attribute_value_length_limits_cut_long_values(
    otlp: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT cuts span attributes, the general one events'.

    As the SDK cuts them: a message key or tenant of thousands of characters, or a handler's
    exception message, no longer rides every span whole when the operator set a limit.
    """
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: PLC0415
        ExportTraceServiceRequest,
    )

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp.endpoint)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "16")
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "24")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", f"deployment.name={'d' * 40}")
    assert tracing.configure(os.environ, service="pipeline-test")
    try:
        message = Message("t", 0, 1, "ключ".encode() * 500, b"v", {"pl-tenant": b"T" * 5000}, 1)
        delivery = tracing.process(message, "lane")
        assert delivery is not None
        token = tracing.guard_entered(delivery)
        tracing.handler_ran("lane", time.perf_counter(), RuntimeError("boom " * 1000))
        tracing.guard_left(delivery, token)
        tracing.finish(delivery, "retried")
    finally:
        tracing.shutdown()
    values: list[tuple[str, str]] = []
    for body in otlp.bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            values += [("resource", a.value.string_value) for a in resource.resource.attributes]
        for scope in (s for r in request.resource_spans for s in r.scope_spans):
            for span in scope.spans:
                values += [("span", a.value.string_value) for a in span.attributes]
                for event in span.events:
                    values += [("event", a.value.string_value) for a in event.attributes]
    assert max(len(v) for kind, v in values if kind == "span") == 16
    assert max(len(v) for kind, v in values if kind == "event") == 24
    assert ("span", "ключ" * 4) in values
    assert ("span", "T" * 16) in values
    assert ("resource", "d" * 40) in values  # the resource is not cut, as in the SDK
