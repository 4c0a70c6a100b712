"""What tracing costs, for ``bench/runtime.py`` and ``bench/ingress.py`` (their ``tracing`` parts).

* ``tracing_overhead``: throughput with tracing on at 100 % sampling (``always_on``), exporting
  over OTLP/HTTP to a sink in its own process (``bench/otlp_sink.py``), ÷ the same run with
  tracing off; interleaved, median of the per-repeat ratios. The batch processor's queue is
  raised (``OTEL_BSP_MAX_QUEUE_SIZE``) so no span is dropped to save time.
* ``tracing_off_overhead``: what the tracing hooks cost while tracing is off, against the code
  without them: 1 - (time of the hooks one message or request calls, measured in a tight loop
  with tracing off) ÷ (CPU time per message or request of the tracing-off run). A ratio of two
  end-to-end runs could not resolve 2 % on a shared machine; the hooks' own cost can be timed
  exactly.
* ``tracing_export_us_per_delivery``: CPU microseconds the exporting process spends turning one
  delivery record (a handled first delivery with a ``traceparent``: partition wait, process,
  guard and handler spans) into OTLP bytes, timed in a tight loop here;
  ``tracing_export_sdk_us_per_delivery`` the same with the SDK's span objects and encoder.
* ``tracing_hooks_on_us_per_msg``: the same hooks as ``tracing_off_overhead`` times, with
  tracing on at 100 % (recording into a buffer nobody ships): what a traced delivery costs the
  traced process's own thread.
* ``tracing_exporter_cpu_us_per_delivery``: CPU microseconds of the real exporting process
  (``python -m pipeline.tracing.export``, OTLP/HTTP to the sink) per delivery, for
  ``PIPED_DELIVERIES`` records made by the member's hooks and piped to it as the traced
  process's thread writes them; its start-up (an empty run's CPU) is not counted.
* ``tracing_export_us_per_request`` (``bench/ingress.py``): the same for one accepted webhook's
  records (its request span with the ``verify`` and ``log commit`` stages and a tenant, and the
  send of its event under the request's ``traceparent``); ``tracing_export_sdk_us_per_request``
  with the SDK's spans and encoder.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from common import BenchError
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource

from pipeline import tracing
from pipeline.envelope import Message
from pipeline.tracing import spans
from pipeline.tracing.export import MAX_EXPORT_BATCH, READY, Spans, WireSpans
from pipeline.tracing.framing import frame
from pipeline.tracing.record import DELIVERY, SEND, WEBHOOK, Buffer, Record, Sampler

SINK = Path(__file__).resolve().parent / "otlp_sink.py"
TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
HOOK_LOOPS = 200_000


@contextlib.contextmanager
def otlp_sink() -> Iterator[str]:
    """A sink process; yields its traces endpoint."""
    proc = subprocess.Popen([sys.executable, str(SINK)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None  # noqa: S101 - piped above
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}/v1/traces"
    finally:
        proc.terminate()
        proc.wait(10)


def traced_env(
    endpoint: str, *, sampled_only: bool = False, unexported: bool = False
) -> dict[str, str]:
    """The standard variables that turn tracing on at 100 % towards ``endpoint``.

    ``sampled_only``: the default parent-based sampler instead, which records only what the
    caller's ``traceparent`` says is sampled. ``unexported``: a batch queue of one record
    (``OTEL_BSP_MAX_QUEUE_SIZE=1``), so the traced process runs every hook and drops what they
    record at once, and nothing reaches the exporting process: the hooks' own cost in place.
    """
    return {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
        "OTEL_TRACES_SAMPLER": "parentbased_always_on" if sampled_only else "always_on",
        "OTEL_BSP_MAX_QUEUE_SIZE": "1" if unexported else "262144",
        "OTEL_BSP_SCHEDULE_DELAY": "500",
    }


@contextlib.contextmanager
def traced_here(
    endpoint: str, system: str = "kafka", *, sampled_only: bool = False
) -> Iterator[None]:
    """Tracing on in this process while inside; flushed and off afterwards."""
    saved = {k: os.environ.get(k) for k in traced_env(endpoint)}
    os.environ.update(traced_env(endpoint, sampled_only=sampled_only))
    try:
        tracing.configure(os.environ, service="pipeline-bench", system=system)
        yield
    finally:
        tracing.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _timed(loop: int, body: object) -> float:
    """Seconds per call of ``body``: the best of five rounds (as timeit advises)."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(loop // 5):
            body()  # type: ignore[operator]
        best = min(best, (time.perf_counter() - started) / (loop // 5))
    return best


def _delivery(message: Message, started_s: float) -> None:
    """The hooks of one handled delivery, as chain.py and handling.py call them.

    ``started_s``: when the handler started (``time.perf_counter``). With tracing off only the
    first and the handler's are called, each returning at once.
    """
    delivery = tracing.process(message, "lane")
    if delivery is None:
        tracing.handler_ran("lane", started_s, None)
        return
    tracing.admitted(delivery)
    token = tracing.guard_entered(delivery)
    tracing.handler_ran("lane", started_s, None)
    tracing.guard_left(delivery, token)
    tracing.finish(delivery, "handled")


def member_hooks_s() -> float:
    """Seconds the member's tracing hooks take per message with tracing off."""
    message = Message("t", 0, 1, b"k", b"v", {"traceparent": TRACEPARENT}, 1)

    def nothing(_message: Message, _started_s: float) -> None:
        pass

    one = functools.partial(_delivery, message, 0.0)
    empty = functools.partial(nothing, message, 0.0)  # the same call, without the hooks
    return max(0.0, _timed(HOOK_LOOPS, one) - _timed(HOOK_LOOPS, empty))


def _recording(limit: int) -> Buffer:
    """Tracing on at 100 %, recording into a buffer of ``limit`` records that nobody ships."""
    buffer = Buffer(limit, limit, lambda: None)
    spans.install(buffer, Sampler(lambda _trace, _name: True, follow=False, always=True), "kafka")
    return buffer


def member_hooks_on_s() -> float:
    """Seconds the member's hooks take per delivery with tracing on at 100 %."""
    message = Message("t", 0, 1, b"k", b"v", {"traceparent": TRACEPARENT}, 1)
    rounds, loop = 5, HOOK_LOOPS // 5
    buffer = _recording(loop + 1)
    best = float("inf")
    try:
        for _ in range(rounds):
            buffer.take()
            started = time.perf_counter()
            for _ in range(loop):
                _delivery(message, 0.0)
            best = min(best, (time.perf_counter() - started) / loop)
    finally:
        spans.install(None)
    return best


PIPED_DELIVERIES = 50_000


def delivery_records(n: int) -> list[Record]:
    """``n`` handled first deliveries' records, made by the member's hooks (12 partitions)."""
    buffer = _recording(n + 1)
    try:
        for i in range(n):
            headers = {"traceparent": TRACEPARENT, "pl-tenant": b"tenant-%d" % (i % 50)}
            message = Message("orders", i % 12, i, b"key-%d" % (i % 1000), b"v", headers, 1)
            _delivery(message, time.perf_counter())
    finally:
        spans.install(None)
    return buffer.take()


def exporter_cpu_s(records: list[Record], endpoint: str) -> float:
    """CPU seconds the exporting process spends on ``records``, its start-up not counted."""
    return max(0.0, _exporter_run(records, endpoint) - _exporter_run([], endpoint))


def _exporter_run(records: list[Record], endpoint: str) -> float:
    """The exporting process's CPU seconds for ``records`` piped to it, start to exit."""
    env = {**os.environ, **traced_env(endpoint)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.tracing.export", "bench"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None  # noqa: S101 - piped above
    assert proc.stdout is not None  # noqa: S101
    try:
        if proc.stdout.read(len(READY)) != READY:
            raise BenchError("python -m pipeline.tracing.export did not start")
        for start in range(0, len(records), MAX_EXPORT_BATCH):
            proc.stdin.write(frame(records[start : start + MAX_EXPORT_BATCH]))
        proc.stdin.close()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    if proc.returncode != 0:
        raise BenchError(f"the exporting process exited with {proc.returncode}")
    return usage.ru_utime + usage.ru_stime


def ingress_hooks_s() -> float:
    """Seconds the ingress's tracing hooks take per request with tracing off."""
    headers = {"x-hub-signature-256": "sha256=0"}

    def one() -> None:  # as app.py and dispatch.py call them
        with tracing.webhook("bench", headers), tracing.stage("verify"):
            pass
        tracing.on()
        with tracing.stage("log commit"):
            pass

    def empty() -> None:
        pass

    return max(0.0, _timed(HOOK_LOOPS, one) - _timed(HOOK_LOOPS, empty))


EXPORT_LOOPS = 20_000


def export_encode_s() -> tuple[float, float]:
    """Seconds per delivery record to encode it: the exporting process's way, and the SDK's."""
    t0 = time.time_ns()
    record = (
        *(DELIVERY, TRACEPARENT, t0 - 5_000_000, t0, 0, None, 0, 0, t0 + 4_000, t0 + 20_000),
        *(t0 + 5_000, t0 + 9_000, None, t0 + 30_000, "kafka", "orders", 3, 1_234_567, "orders"),
        *("orders-workers", None, 1, None, b"conversation-42", "handled", None, None),
    )
    return _encode_s([record])


def _encode_s(records: list[Record]) -> tuple[float, float]:
    """Seconds to encode ``records``: the exporting process's way, and the SDK's."""
    resource = Resource.create({"service.name": "bench"})
    wire, sdk = WireSpans(resource), Spans(resource)

    def ours() -> None:
        for record in records:
            list(wire.of(record))

    def theirs() -> None:
        encode_spans([span for record in records for span in sdk.of(record)])

    return _timed(EXPORT_LOOPS, ours), _timed(EXPORT_LOOPS // 10, theirs)


def request_export_encode_s() -> tuple[float, float]:
    """Seconds per accepted webhook to encode its records: our way, and the SDK's."""
    t0 = time.time_ns()
    trace_id, request_id = int(TRACEPARENT[3:35], 16), 0x1A2B3C4D5E6F7081
    request: Record = (
        *(WEBHOOK, trace_id, request_id, int(TRACEPARENT[36:52], 16), "bench", t0, t0 + 900_000),
        {"pipeline.tenant": "acme"},
        None,
        None,
        [
            ("verify", t0 + 10_000, t0 + 40_000, None, None),
            ("log commit", t0 + 60_000, t0 + 850_000, None, None),
        ],
    )
    carried = b"00-%032x-%016x-01" % (trace_id, request_id)
    send: Record = (
        *(SEND, carried, 0x0F1E2D3C4B5A6978, "redis", "bench_ingress", b"conversation-42"),
        *(t0 + 1_000_000, t0 + 1_400_000, None, None),
    )
    return _encode_s([request, send])


def off_overhead(hooks_s: float, cpu_s_per_item: float) -> float:
    """Throughput without the hooks is at most this much above the hooks-off run."""
    return 1 - hooks_s / cpu_s_per_item if cpu_s_per_item > 0 else 1.0
