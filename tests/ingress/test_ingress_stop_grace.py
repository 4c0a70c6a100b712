"""``pipeline ingress serve`` stopped while its broker does not answer ends within its grace."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from faults.services import KafkaServer, kafka_libs
from ingress.helpers import META, meta_body, serve_until_listening, write_sources, write_topics
from ingress.signing import hub_signature

from pipeline.config import IngressSettings, Settings
from pipeline.logstore import RowState, Selection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.transport import create_transport
from pipeline.transport.protocol import TopicConfig

SECRET = "stop-grace-secret"  # noqa: S105 - a test secret
STOP_WITHIN_S = 8.0
"""The stop bound the test sets: shorter than the 35 s default, it proves the same sooner."""
MANIFEST = Path(__file__).parents[2] / "deploy" / "k8s" / "base" / "ingress.yaml"


@pytest.fixture
def paused_kafka(tmp_path: Path) -> Iterator[KafkaServer]:
    """A single-node Kafka broker of this test's own, which the test may pause (SIGSTOP)."""
    libs = kafka_libs()
    if libs is None or shutil.which("java") is None:
        pytest.skip("the Kafka jars are not cached; run `make services` once")
    server = KafkaServer(tmp_path / "kafka", libs)
    server.start()
    yield server
    server.stop()


async def post(url: str, numbers: range) -> list[int]:
    """POST the numbered Meta deliveries, signed; their status codes."""
    statuses = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for n in numbers:
            body = meta_body(n)
            headers = {"x-hub-signature-256": hub_signature(SECRET, body)}
            statuses.append(
                (await http.post("/hooks/whatsapp", content=body, headers=headers)).status_code
            )
    return statuses


async def until_produced(store: SqliteLogStore, count: int, timeout_s: float = 30.0) -> None:
    """Poll the log until ``count`` rows are marked produced; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (await store.count_by_state(Selection())).get(RowState.PRODUCED, 0) < count:
        assert time.monotonic() < deadline, "the first event was not produced"
        await asyncio.sleep(0.05)


async def test_a_stop_with_the_broker_silent_ends_within_the_grace_and_says_what_is_left(
    tmp_path: Path,
    settings: Settings,
    paused_kafka: KafkaServer,
    started: list[subprocess.Popen[str]],
    unique: str,
) -> None:
    """A SIGTERM while Kafka does not answer ends the process, exit 0, within its stop bound.

    Through the stop its metrics port answers ``/readyz`` 503 and ``/healthz`` 200 (it used to
    close as soon as the webhook port stopped serving, before the stop was done).
    """
    topic = f"messages-{unique}"
    broker = settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(
                update={"bootstrap_servers": paused_kafka.bootstrap_servers}
            )
        }
    )
    transport = create_transport(broker, "kafka")
    try:
        await transport.admin().create_topic(TopicConfig(topic, 2))
    finally:
        await transport.close()
    write_topics(tmp_path / "topics", {topic: "messages"})
    source = {**META, "secrets": ["env:PIPELINE_TEST_GRACE_SECRET"], "topic": topic, "routes": []}
    write_sources(tmp_path / "sources.yaml", {"whatsapp": source})
    with socket.socket() as probe:  # a port free now, for the ingress's metrics
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env |= {
        "PIPELINE_TEST_GRACE_SECRET": SECRET,
        "PIPELINE_TRANSPORT": "kafka",
        "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": paused_kafka.bootstrap_servers,
        # Sends wait 60 s (message.timeout.ms) for a broker that does not answer: longer than
        # the producer's own 30 s flush on close.
        "PIPELINE_KAFKA__REQUEST_TIMEOUT_MS": "20000",
        "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
        "PIPELINE_INGRESS__SOURCES_FILE": str(tmp_path / "sources.yaml"),
        "PIPELINE_INGRESS__SQLITE_PATH": str(tmp_path / "ingress.db"),
        "PIPELINE_INGRESS__SWEEPER__ENABLED": "false",
        "PIPELINE_INGRESS__STOP_WITHIN_S": str(STOP_WITHIN_S),
        "PIPELINE_INGRESS__METRICS_PORT": str(metrics_port),
    }
    proc, url = serve_until_listening(env, started)
    store = SqliteLogStore(tmp_path / "ingress.db")
    await store.open()
    try:
        assert await post(url, range(1)) == [200]  # the producer knows the topic and the broker
        await until_produced(store, 1)
        paused_kafka.pause()  # connections stay open, nothing answers
        assert await post(url, range(1, 6)) == [200] * 5
        proc.send_signal(signal.SIGTERM)
        try:
            async with httpx.AsyncClient(timeout=5) as http:
                probes = f"http://127.0.0.1:{metrics_port}"
                ready = 200
                while ready == 200:  # until the signal is handled
                    ready = (await http.get(f"{probes}/readyz")).status_code
                    await asyncio.sleep(0.02)
                alive = (await http.get(f"{probes}/healthz")).status_code
            _, stderr = proc.communicate(timeout=STOP_WITHIN_S + 5)  # the supervisor's margin
        finally:
            paused_kafka.resume()
        assert alive == 200
        assert proc.returncode == 0, stderr
        assert "5 events left unproduced" in stderr, stderr
        assert await store.count_by_state(Selection()) == {
            RowState.PRODUCED: 1,
            RowState.RECEIVED: 5,
        }
    finally:
        await store.close()


def test_the_ingress_pod_grace_outlasts_its_pre_stop_hook_and_stop_bound() -> None:
    """Kubernetes' SIGKILL comes after the preStop hook plus the ingress's own stop bound."""
    pod = yaml.safe_load_all(MANIFEST.read_text(encoding="utf-8"))
    spec = next(doc for doc in pod if doc["kind"] == "Deployment")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {item["name"]: item["value"] for item in container.get("env", [])}
    stop_within_s = float(
        env.get("PIPELINE_INGRESS__STOP_WITHIN_S", IngressSettings().stop_within_s)
    )
    hook = container["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[0] == "sleep", hook  # the grace counts from before the hook, SIGTERM after it
    assert spec["terminationGracePeriodSeconds"] > float(hook[1]) + stop_within_s
