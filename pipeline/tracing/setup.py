"""Turning tracing on from the standard ``OTEL_*`` variables, at the edge of a process.

Tracing is on when an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT``), unless ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none``. The SDK then reads the rest itself: the sampler
(``OTEL_TRACES_SAMPLER``, ``OTEL_TRACES_SAMPLER_ARG``), the resource (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``), the exporter's headers and timeouts and the batch processor's
delays. Spans go over OTLP/HTTP (protobuf). The SDK is imported only here and only when on; it
comes with the ``pipeline[otel]`` extra.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.errors import ConfigError
from pipeline.tracing import spans

_provider: Any = None


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
    """
    global _provider  # noqa: PLW0603 - one provider per process, shut down at exit
    if not wanted(environ):
        return False
    try:
        # The SDK is optional: imported only when tracing is asked for.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
        from opentelemetry.sdk.trace.sampling import ParentBased  # noqa: PLC0415
    except ImportError:
        raise TracingUnavailable(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed: "
            "install pipeline[otel] (pip install 'pipeline[otel]') or unset the variable"
        ) from None
    shutdown()
    resource = Resource.create({SERVICE_NAME: environ.get("OTEL_SERVICE_NAME") or service})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _provider = provider
    follow = isinstance(provider.sampler, ParentBased)
    spans.install(provider.get_tracer("pipeline"), system, follow_parent=follow)
    return True


def shutdown() -> None:
    """Export what is buffered and turn tracing off (idempotent)."""
    global _provider
    spans.install(None)
    if _provider is not None:
        provider, _provider = _provider, None
        provider.shutdown()
