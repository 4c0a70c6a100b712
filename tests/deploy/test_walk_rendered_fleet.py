"""Every workload `kubectl apply -k deploy/k8s` would start, run here as rendered.

test_deployed_processes.py runs the ingress and `consumer-messages`; an operator's fleet also
runs the debounced (`consumer-ai-turns`) and throttled (`consumer-engagement`) groups, the
schema registry and the daily `log-purge` CronJob. Each is started with its rendered args and
variables (this machine's services and free ports put in, as there): the consumers get ready on
their probes and export what their ScaledObjects query, the registry listens on its probed port
and refuses an anonymous request, the purge runs to its end without the sources volume the
ingress mounts, and each long-running one stops on SIGTERM inside its grace.

`kubectl apply --dry-run=client` needs an API server even with `--validate=false` (it asks for
the API's discovery document to map each kind), so nothing here calls it: the documents come
from `kubectl kustomize`, which runs offline (tests/deploy/test_k8s.py checks their schema).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from support import k8s_of_kind
from test_deployed_processes import (
    WHATSAPP,
    Run,
    check_scaling_metrics,
    component,
    environment,
    local,
    pod_spec,
    start,
    stop,
)

from pipeline.config import load_settings
from pipeline.testing.ports import free_port


@pytest.fixture
def schema(postgres_service: str) -> Iterator[str]:
    """A PostgreSQL schema of this test's own, dropped after it."""
    name = f"walk_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_service, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    yield name
    with psycopg.connect(postgres_service, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def overlay_of(tmp_path: Path, unique: str, schema: str) -> dict[str, str]:
    """What an environment's overlay and pipeline-secrets would set, for this machine."""
    sources = tmp_path / "sources.yaml"
    sources.write_text(WHATSAPP, encoding="utf-8")
    return {
        "PIPELINE_REDIS__KEY_PREFIX": f"walk{unique}",
        "PIPELINE_INGRESS__POSTGRES_SCHEMA": schema,
        "PIPELINE_INGRESS__SOURCES_FILE": str(sources),
        "PIPELINE_POSTGRES__URL": load_settings().postgres.url,
        "PIPELINE_MEMBERSHIP__SLOT_DIR": str(tmp_path / "slots"),
        "META_APP_SECRET": f"secret-{unique}",
    }


def only(kind: str, name: str) -> dict[str, Any]:
    """The rendered document of ``kind`` named ``name``."""
    (found,) = [d for d in k8s_of_kind(kind) if d["metadata"]["name"] == name]
    return found


@pytest.mark.usefixtures("redis_service")
def test_every_consumer_group_runs_as_rendered_and_feeds_its_scaled_object(
    tmp_path: Path, unique: str, schema: str
) -> None:
    """Each lane's member gets ready and exports its ScaledObject's metrics beside the ingress."""
    overlay = overlay_of(tmp_path, unique, schema)
    consumers = component("consumer")
    assert {d["metadata"]["name"] for d in consumers} >= {
        "consumer-ai-turns",
        "consumer-engagement",
        "consumer-messages",
    }
    topics = subprocess.run(
        [sys.executable, "-m", "pipeline", "topics", "apply"],
        env=local(environment(pod_spec(consumers[0])["containers"][0]), {}, overlay),
        capture_output=True,
        check=False,
    )
    assert topics.returncode == 0, topics.stderr.decode()
    runs: dict[str, Run] = {}
    try:
        for deployment in [*consumers, *component("ingress")]:
            runs[deployment["metadata"]["name"]] = start(deployment, overlay, tmp_path)
        for deployment in consumers:
            name = deployment["metadata"]["name"]
            member = {n: r for n, r in runs.items() if n in {name, "ingress"}}
            check_scaling_metrics(only("ScaledObject", name), member)
    finally:
        for name, run in runs.items():
            stop(name, run)


def test_the_registry_serves_its_probed_port_with_auth_and_stops_inside_its_grace(
    tmp_path: Path, schema: str
) -> None:
    """Rendered: two replicas on PostgreSQL, auth required; the tcp probe's port answers.

    The grace counts from before the preStop hook's 5 s sleep.
    """
    (registry,) = component("registry")
    spec = pod_spec(registry)
    (container,) = spec["containers"]
    ports = {p["containerPort"]: free_port() for p in container["ports"]}
    named = {p["name"]: ports[p["containerPort"]] for p in container["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["tcpSocket"]["port"] in named
    store = f"{load_settings().postgres.url}?options=-csearch_path%3D{schema}"
    env = local(environment(container), ports, {"PIPELINE_REGISTRY__STORE": store})
    args = [str(ports[int(a)]) if a.isdigit() and int(a) in ports else a for a in container["args"]]
    log = tmp_path / "registry.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipeline", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text(encoding="utf-8")
            assert time.monotonic() < deadline, log.read_text(encoding="utf-8")
            try:
                socket.create_connection(("127.0.0.1", named["http"]), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        url = f"http://127.0.0.1:{named['http']}/subjects"
        assert httpx.get(url).status_code == httpx.codes.UNAUTHORIZED
        assert httpx.get(url, auth=("ci", "pw")).json() == []  # the users of SECRETS
    finally:
        pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=spec["terminationGracePeriodSeconds"] - pre_stop)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail(f"the registry outlived its grace:\n{log.read_text(encoding='utf-8')}")


def test_the_log_purge_runs_as_rendered_without_the_sources_volume(
    tmp_path: Path, schema: str
) -> None:
    """The CronJob's pod mounts no sources file (the config map names one): purge needs none."""
    (cron,) = k8s_of_kind("CronJob")
    spec = pod_spec(cron)
    (container,) = spec["containers"]
    mounted = {m["mountPath"] for m in container.get("volumeMounts", [])}
    env = environment(container)
    assert Path(env["PIPELINE_INGRESS__SOURCES_FILE"]).parent.as_posix() not in mounted
    overlay = {
        "PIPELINE_POSTGRES__URL": load_settings().postgres.url,
        "PIPELINE_INGRESS__POSTGRES_SCHEMA": schema,
    }
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", *container["args"]],
        env=local(env, {}, overlay),
        cwd=tmp_path,  # not the checkout: the image's /app holds topics/ and consumers/ only
        capture_output=True,
        text=True,
        timeout=spec.get("activeDeadlineSeconds", 120),
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "purged 0 rows", done.stdout + done.stderr
