"""Turning tracing on from the standard ``OTEL_*`` variables, at the edge of a process.

Tracing is on when an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT``), unless ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none``. The SDK then reads the rest itself: the sampler
(``OTEL_TRACES_SAMPLER``, ``OTEL_TRACES_SAMPLER_ARG``), the resource (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``), the exporter's headers and timeouts and the batch processor's
delays. The stages record into plain objects (:mod:`.record`); a process of its own
(:mod:`.export`) makes the SDK's spans of them and exports them over OTLP/HTTP (protobuf). The SDK
is imported only here and there, and only when on; it comes with the ``pipeline[otel]`` extra.
"""

from __future__ import annotations

import atexit
from collections.abc import Mapping
from typing import Any

from pipeline.errors import ConfigError
from pipeline.tracing import spans
from pipeline.tracing.record import Sampler

_shipper: Any = None


class TracingUnavailable(ConfigError):
    """An OTLP endpoint is set but the OpenTelemetry SDK is not installed."""


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the variables ask for traces to be exported."""
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not endpoint:
        return False
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    return exporters != "none"


def configure(environ: Mapping[str, str], *, service: str, system: str = "redis") -> bool:
    """Turn tracing on if ``environ`` asks for it; True when it is on.

    Args:
        environ: the process environment (``os.environ``); the SDK reads its own variables
            from the process environment too.
        service: ``service.name`` when ``OTEL_SERVICE_NAME`` does not set one.
        system: the transport, for ``messaging.system``.

    Raises:
        TracingUnavailable: an endpoint is set but ``pipeline[otel]`` is not installed.
        ConfigError: a variable the SDK reads at start is malformed (a span limit).
    """
    global _shipper  # noqa: PLW0603 - one exporting process per process, shut down at exit
    if not wanted(environ):
        return False
    try:
        # The SDK is optional: imported only when tracing is asked for.
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401, PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.sampling import ParentBased  # noqa: PLC0415

        from pipeline.tracing.shipper import Shipper  # noqa: PLC0415
    except ImportError:
        raise TracingUnavailable(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed: "
            "install pipeline[otel] (pip install 'pipeline[otel]') or unset the variable"
        ) from None
    shutdown()
    try:
        sampler = TracerProvider(shutdown_on_exit=False).sampler  # OTEL_TRACES_SAMPLER(_ARG)
    except ValueError as exc:  # the SDK refuses a malformed OTEL_*_LIMIT, naming it
        raise ConfigError(f"{exc} (an OpenTelemetry variable: correct it or unset it)") from None
    description = sampler.get_description()
    always = None
    if description.startswith(("AlwaysOnSampler", "ParentBased{root:AlwaysOnSampler")):
        always = True
    elif description.startswith(("AlwaysOffSampler", "ParentBased{root:AlwaysOffSampler")):
        always = False

    def decide(trace_id: int, name: str) -> bool:
        return bool(sampler.should_sample(None, trace_id, name).decision.is_sampled())  # type: ignore[no-untyped-call]

    _shipper = Shipper(environ, environ.get("OTEL_SERVICE_NAME") or service)
    atexit.unregister(shutdown)  # once, however often configured
    atexit.register(shutdown)  # what is still buffered is exported at exit, as the SDK does
    follow = isinstance(sampler, ParentBased)
    spans.install(_shipper.buffer, Sampler(decide, follow=follow, always=always), system)
    return True


def shutdown() -> None:
    """Export what is buffered and turn tracing off (idempotent)."""
    global _shipper
    spans.install(None)
    if _shipper is not None:
        shipper, _shipper = _shipper, None
        shipper.shutdown()
