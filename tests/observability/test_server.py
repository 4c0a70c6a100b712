"""The cached /metrics endpoint, /healthz and /readyz, alone and inside the ingress app."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter

import httpx
import pytest
from support import serving_metrics

from pipeline.errors import ConfigError
from pipeline.ingress.app import IngressApp
from pipeline.observability.facades import IngressMetrics, RuntimeMetrics
from pipeline.observability.metrics import Metrics
from pipeline.observability.server import MetricsServer, metrics_socket, serve_metrics
from pipeline.observability.sources import IngressSource


class HangingSource:
    """A source whose broker never answers."""

    name = "hanging"

    def __init__(self) -> None:
        """Not started yet."""
        self.started = asyncio.Event()

    async def refresh(self) -> None:
        """Wait forever."""
        self.started.set()
        await asyncio.Event().wait()


class FailingSource:
    """A source whose broker refuses every read."""

    name = "failing"

    async def refresh(self) -> None:
        """Fail."""
        raise ConnectionError("broker down")


class CountingSource:
    """A source that records one expired message per refresh."""

    name = "counting"

    def __init__(self, metrics: Metrics) -> None:
        """Write into ``metrics``."""
        self.runtime = RuntimeMetrics(metrics)

    async def refresh(self) -> None:
        """Count one expired message."""
        self.runtime.expired("messages")


def client(app: object) -> httpx.AsyncClient:
    """An HTTP client calling the ASGI app in process."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")  # type: ignore[arg-type]


async def test_scrape_returns_the_snapshot_while_a_source_hangs():
    """A scrape answers at once from the last snapshot although the refresher is stuck."""
    metrics = Metrics()
    hanging = HangingSource()
    server = MetricsServer(metrics, [hanging], interval_s=3600, source_timeout_s=3600)
    RuntimeMetrics(metrics).expired("messages")
    server.start()
    try:
        await asyncio.wait_for(hanging.started.wait(), 10)
        async with client(server) as http:
            response = await asyncio.wait_for(http.get("/metrics"), 10)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        assert b"pipeline_oldest_message_age_seconds" in response.content
    finally:
        await server.close()


async def test_refresh_renders_new_values_only_after_it_ran():
    """Values written by a source appear in the snapshot after the refresh, not before."""
    metrics = Metrics()
    server = MetricsServer(metrics, [CountingSource(metrics)])
    line = b'pipeline_expired_total{lane="messages"} 1.0'
    assert line not in server.snapshot
    assert await server.refresh_once()
    assert line in server.snapshot
    assert metrics.registry.get_sample_value("pipeline_metrics_refresh_timestamp_seconds") > 0


async def test_a_failing_or_slow_source_is_counted_and_keeps_the_timestamp_still():
    """Errors and timeouts are counted per source; the refresh time moves only on success."""
    metrics = Metrics()
    server = MetricsServer(metrics, [FailingSource(), HangingSource()], source_timeout_s=0.05)
    assert not await server.refresh_once()
    errors = "pipeline_metrics_refresh_errors_total"
    assert metrics.registry.get_sample_value(errors, {"source": "failing"}) == 1
    assert metrics.registry.get_sample_value(errors, {"source": "hanging"}) == 1
    assert metrics.registry.get_sample_value("pipeline_metrics_refresh_timestamp_seconds") == 0


async def test_healthz_and_readyz_follow_the_ready_flag():
    """/healthz is always 200; /readyz is 503 until the owner says ready; others are 404."""
    server = MetricsServer(Metrics())
    async with client(server) as http:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).status_code == 503
        server.ready = True
        assert (await http.get("/readyz")).status_code == 200
        assert (await http.get("/nope")).status_code == 404
        assert (await http.post("/metrics")).status_code == 405


async def test_serve_metrics_listens_on_a_real_port():
    """serve_metrics serves the snapshot over HTTP until stopped."""
    server = MetricsServer(Metrics(), interval_s=3600)
    async with serving_metrics(server) as port, httpx.AsyncClient() as http:
        response = await http.get(f"http://127.0.0.1:{port}/metrics")
    assert response.status_code == 200
    assert b"pipeline_metrics_refresh_timestamp_seconds" in response.content


async def test_serve_metrics_serves_on_the_socket_bound_before_it():
    """A socket bound by metrics_socket is the one served on, and it is closed at the end."""
    sock = metrics_socket("127.0.0.1", 0, "PORT_VARIABLE", "HOST_VARIABLE")
    port = sock.getsockname()[1]
    server = MetricsServer(Metrics(), interval_s=3600)
    stop = asyncio.Event()
    bound: asyncio.Future[tuple[str, int]] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve_metrics(
            server, "127.0.0.1", port, stop, lambda h, p: bound.set_result((h, p)), sock=sock
        )
    )
    try:
        assert await asyncio.wait_for(bound, 10) == ("127.0.0.1", port)
        async with httpx.AsyncClient() as http:
            response = await http.get(f"http://127.0.0.1:{port}/metrics")
        assert response.status_code == 200
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert sock.fileno() == -1


def test_a_metrics_port_held_by_another_process_is_one_line_naming_its_variable():
    """The port is taken: a ConfigError naming the address, the variable and what to do."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError) as caught:
            metrics_socket("127.0.0.1", port, "PORT_VARIABLE", "HOST_VARIABLE")
    assert str(caught.value) == (
        f"cannot listen on 127.0.0.1:{port} for /metrics: Address already in use; another "
        "process holds it: stop that process or set PORT_VARIABLE to a free port"
    )


async def test_ingress_app_serves_metrics_with_its_counters():
    """The ingress answers /metrics beside its hooks, with its request counters exported."""
    app = IngressApp({}, None, None)  # type: ignore[arg-type]
    metrics = Metrics()
    server = MetricsServer(metrics, [IngressSource(app, IngressMetrics(metrics))])
    app.observer = server
    app.counters.update(Counter({("github", "accepted"): 2, ("github", "shed"): 1}))
    await server.refresh_once()
    async with client(app) as http:
        text = (await http.get("/metrics")).text
        missing = await http.get("/hooks/unknown")
    assert (
        'pipeline_ingress_requests_total{outcome="accepted",reason="",source="github"} 2.0' in text
    )
    assert 'pipeline_ingress_requests_total{outcome="shed",reason="",source="github"} 1.0' in text
    assert missing.status_code == 404
