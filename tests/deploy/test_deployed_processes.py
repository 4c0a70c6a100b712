"""What `kubectl apply -k deploy/k8s` would run is what the code is.

`kubectl kustomize deploy/k8s` renders the manifests; each container's arguments are parsed by
the real command line, its variables (the config map, then its own `env`) are read by the real
settings classes, and its probes and ports are held to what the process serves. The last test
runs the ingress and a consumer group's member as the rendered manifests configure them (the
addresses and ports of this machine's services put in), sends a webhook, and reads both
processes' `/metrics` for what the ScaledObject queries.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
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
import typer
from support import k8s_of_kind, rendered_k8s

from pipeline.cli import app as cli
from pipeline.config import _OTHER_VARIABLES, ENV_PREFIX, Settings, _variables, load_settings
from pipeline.observability.server import PATHS
from pipeline.registry.settings import load_registry_settings
from pipeline.testing.ports import free_port

ROOT = Path(__file__).parents[2]
WORKLOADS = {"Deployment", "CronJob"}
SETTINGS = _variables(Settings, ENV_PREFIX)
SECRETS = {  # what the Secrets the manifests name would hold (docs/operations.md)
    ("pipeline-registry", "store"): "postgresql://registry:secret@postgres/registry",
    ("pipeline-registry", "users"): '[{"username": "ci", "password": "pw", "role": "write"}]',
}
FIELDS = {"metadata.name": "consumer-messages-5d8f7c9b4-x2k9q", "metadata.namespace": "pipeline"}


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a Deployment or a CronJob."""
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"]  # type: ignore[no-any-return]


def containers() -> list[tuple[str, dict[str, Any]]]:
    """(workload name, container) of every workload."""
    return [
        (w["metadata"]["name"], c)
        for w in rendered_k8s()
        if w["kind"] in WORKLOADS
        for c in pod_spec(w)["containers"]
    ]


def component(name: str) -> list[dict[str, Any]]:
    """The Deployments of one component (ingress, registry, consumer)."""
    return [
        d
        for d in k8s_of_kind("Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == name
    ]


def environment(container: dict[str, Any]) -> dict[str, str]:
    """The variables the container starts with: envFrom in order, then env (the kubelet's way).

    Secrets referred to as a whole (`pipeline-secrets`) hold only secrets' names the test gives
    later; single keys come from SECRETS, downward-API fields from FIELDS.
    """
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in k8s_of_kind("ConfigMap")}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(maps[source["configMapRef"]["name"]])
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = SECRETS[ref["name"], ref["key"]]
        else:
            env[item["name"]] = FIELDS[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def parse_args(args: list[str]) -> dict[str, Any]:
    """The options `pipeline <args>` runs with, parsed by the real command line (no run)."""
    command: Any = typer.main.get_command(cli)
    rest, path = list(args), list[str]()
    while hasattr(command, "commands"):  # a group: the next word names its command
        name = rest.pop(0) if rest else ""
        if name not in command.commands:
            pytest.fail(f"`pipeline {' '.join(path)}` has no command {name!r}")
        path.append(name)
        command = command.commands[name]
    try:
        return dict(command.make_context(" ".join(path), rest).params)
    except Exception as exc:  # click's UsageError, whichever click typer carries
        pytest.fail(f"`pipeline {' '.join(args)}` is refused by the command line: {exc}")


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No PIPELINE_* variable of this shell leaks into the settings a container would read."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    return monkeypatch


def settings_of(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a process started with ``env`` reads (ConfigError if it would not start)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load_settings()


def test_every_container_runs_a_command_the_cli_has_with_options_it_takes() -> None:
    """Each container's args are `pipeline` words the real command line parses as they stand."""
    found = containers()
    assert len(found) >= 5
    for _, container in found:
        assert "command" not in container  # the image's entry point, `pipeline`
        parse_args(container["args"])


def test_the_command_line_check_is_real() -> None:
    """A misspelt command or option, or a missing argument, is refused."""
    for args in (
        ["consume", "consumers.messages:app", "--groups", "messages"],
        ["consume", "--group", "messages"],
        ["ingress", "server"],
        ["purge", "--older", "30d"],
    ):
        with pytest.raises(pytest.fail.Exception):
            parse_args(args)


def test_every_variable_is_a_setting_and_every_process_would_start_with_them(
    clean_environment: pytest.MonkeyPatch,
) -> None:
    """Each PIPELINE_* variable is one the settings read, and together they validate."""
    for name, container in containers():
        env = environment(container)
        known = SETTINGS.keys() | _OTHER_VARIABLES
        unknown = {v for v in env if v.startswith(ENV_PREFIX) and v not in known}
        assert not unknown, f"{name}: not settings: {sorted(unknown)}"
        with pytest.MonkeyPatch.context() as patch:
            settings_of(env, patch)
            if container["args"][0] == "registry":
                load_registry_settings()


def test_probes_and_ports_are_what_each_process_serves(
    clean_environment: pytest.MonkeyPatch,
) -> None:
    """Probe paths are served paths, on the named port the process listens on, on every address.

    A consumer serves /healthz, /readyz and /metrics on PIPELINE_RUNTIME__METRICS_PORT, the
    ingress its webhooks on --port and the same paths on PIPELINE_INGRESS__METRICS_PORT, the
    registry its API on --port; bound to 127.0.0.1 (the default) the kubelet could not reach
    them and every probe would fail.
    """
    for deployment in k8s_of_kind("Deployment"):
        (container,) = pod_spec(deployment)["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for probe in ("readinessProbe", "livenessProbe"):
            action = container[probe]
            port = (action.get("httpGet") or action["tcpSocket"])["port"]
            assert port in ports, f"{deployment['metadata']['name']}: {probe} on {port}"
            if "httpGet" in action:
                assert action["httpGet"]["path"] in PATHS
        with pytest.MonkeyPatch.context() as patch:
            settings = settings_of(environment(container), patch)
        options = parse_args(container["args"])
        match container["args"][0]:
            case "consume":
                assert ports == {"metrics": settings.runtime.metrics_port}
                assert settings.runtime.metrics_host == "0.0.0.0"  # noqa: S104
            case "ingress":
                assert ports == {"http": options["port"], "metrics": settings.ingress.metrics_port}
                assert settings.ingress.metrics_host == "0.0.0.0"  # noqa: S104
                assert (options["host"] or settings.ingress.host) == "0.0.0.0"  # noqa: S104
            case "registry":
                assert ports == {"http": options["port"]}
                assert settings.registry.host == "0.0.0.0"  # noqa: S104
            case other:
                pytest.fail(f"a Deployment running `pipeline {other}` is not checked here")
        annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
        if "metrics" in ports:
            assert annotations["prometheus.io/port"] == str(ports["metrics"])


def consumer_groups() -> dict[str, str]:
    """Lane to the group of the consumer Deployment that runs it."""
    groups = {}
    for deployment in component("consumer"):
        options = parse_args(pod_spec(deployment)["containers"][0]["args"])
        for lane in options["lane"]:
            groups[lane] = options["group"]
    return groups


def test_the_sweeper_reads_the_lag_of_the_groups_that_are_deployed(
    clean_environment: pytest.MonkeyPatch,
) -> None:
    """PIPELINE_INGRESS__SWEEPER__LANE_GROUPS names each lane's deployed group (its backlog)."""
    (ingress,) = component("ingress")
    with pytest.MonkeyPatch.context() as patch:
        settings = settings_of(environment(pod_spec(ingress)["containers"][0]), patch)
    assert settings.ingress.sweeper.lane_groups == consumer_groups()


def test_consumers_mark_in_the_ingress_log_what_they_finished(
    clean_environment: pytest.MonkeyPatch,
) -> None:
    """With the ingress's sweeper on, every member marks its finished rows in the same log.

    Otherwise the log never hears that an event was handled: the sweeper replays every row
    after its patience (5 min), `max_replays` times, then abandons it (CRITICAL, the
    PipelineAbandonedWebhooks page) although the handler ran each time.
    """
    (ingress,) = component("ingress")
    with pytest.MonkeyPatch.context() as patch:
        sweeping = settings_of(environment(pod_spec(ingress)["containers"][0]), patch).ingress
    assert sweeping.sweeper.enabled
    for deployment in component("consumer"):
        container = pod_spec(deployment)["containers"][0]
        with pytest.MonkeyPatch.context() as patch:
            member = settings_of(environment(container), patch)
        name = deployment["metadata"]["name"]
        assert member.runtime.mark_processed, f"{name}: PIPELINE_RUNTIME__MARK_PROCESSED"
        assert member.ingress.log_store == sweeping.log_store, name
        assert member.ingress.postgres_schema == sweeping.postgres_schema, name
        secrets = [s["secretRef"] for s in container["envFrom"] if "secretRef" in s]
        assert [s["name"] for s in secrets] == ["pipeline-secrets"], name  # PIPELINE_POSTGRES__URL
        assert not any(s.get("optional") for s in secrets), name  # a missing one: no start


# The rendered processes, run here.

Run = tuple[subprocess.Popen[bytes], dict[str, int], Path]
"""A process started as a container: the process, its named ports here, its output file."""


def local(env: dict[str, str], ports: dict[int, int], extra: dict[str, str]) -> dict[str, str]:
    """``env`` with this machine's services, free ports for the manifests' ones, and ``extra``."""
    here = load_settings()
    moved = {
        "PIPELINE_REDIS__URL": here.redis.url,
        "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": here.kafka.bootstrap_servers,
        "PIPELINE_TOPICS_DIR": str(ROOT / "topics"),
    }
    out = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    for name, value in env.items():
        out[name] = moved.get(name, value)
        if name.endswith("_PORT") and int(value) in ports:
            out[name] = str(ports[int(value)])
    return out | extra


def start(deployment: dict[str, Any], overlay: dict[str, str], logs: Path) -> Run:
    """Start the Deployment's container here as rendered, once its probes answer 200."""
    name = deployment["metadata"]["name"]
    container = pod_spec(deployment)["containers"][0]
    ports = {p["containerPort"]: free_port() for p in container["ports"]}
    args = [str(ports[int(a)]) if a.isdigit() and int(a) in ports else a for a in container["args"]]
    log = logs / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipeline", *args],
            cwd=ROOT,  # the image's WORKDIR holds consumers/ as the checkout does
            env=local(environment(container), ports, overlay),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    named = {p["name"]: ports[p["containerPort"]] for p in container["ports"]}
    run = (process, named, log)
    for probe in ("readinessProbe", "livenessProbe"):
        action = container[probe]["httpGet"]
        wait_ready(f"http://127.0.0.1:{named[action['port']]}{action['path']}", run)
    return run


def wait_ready(url: str, run: Run) -> None:
    """Return once ``url`` answers 200; fail with the process's output if it ends first."""
    process, _, log = run
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text(encoding="utf-8")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=2).status_code == httpx.codes.OK:
                return
        time.sleep(0.1)
    pytest.fail(f"{url} not ready within 60 s:\n{log.read_text(encoding='utf-8')}")


def stop(name: str, run: Run) -> None:
    """SIGTERM, as the kubelet sends it; the process must end, exit 0, inside the pod's grace."""
    process, _, log = run
    (deployment,) = [d for d in k8s_of_kind("Deployment") if d["metadata"]["name"] == name]
    grace = pod_spec(deployment)["terminationGracePeriodSeconds"]
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"{name} outlived its {grace} s grace:\n{log.read_text(encoding='utf-8')}")
    assert code == 0, f"{name} exited {code}:\n{log.read_text(encoding='utf-8')}"


@pytest.fixture
def log_schema(postgres_service: str) -> Iterator[str]:
    """A PostgreSQL schema of its own for the ingress log, dropped after the test."""
    schema = f"k8s_{uuid.uuid4().hex[:10]}"
    yield schema
    with psycopg.connect(postgres_service, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def row_state(url: str, schema: str) -> str | None:
    """The state of the only row of the ingress log once it is `processed` (or after 30 s)."""
    deadline = time.monotonic() + 30
    state = None
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline and state != "processed":
            time.sleep(0.1)
            row = conn.execute(f"SELECT state FROM {schema}.ingress_log").fetchone()  # noqa: S608
            state = row[0] if row else None
    return state


def sample_labels(exposition: str, name: str) -> list[dict[str, str]]:
    """The label sets of the samples of ``name`` in a Prometheus text exposition."""
    found = []
    for line in exposition.splitlines():
        match = re.match(rf"{name}(?:\{{(.*)\}})? ", line)
        if match:
            found.append(dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or "")))
    return found


def queried(query: str) -> list[tuple[str, dict[str, str], bool]]:
    """(metric, its label matchers but `pod`, whether `or vector(0)` stands in when absent)."""
    terms = []
    for match in re.finditer(r'(pipeline_[a-z_]+)\{((?:[^"}]|"[^"]*")*)\}', query):
        labels = dict(re.findall(r'(\w+)=~?"([^"]*)"', match.group(2)))
        labels.pop("pod", None)  # Prometheus's target label: the Pod name
        defaulted = bool(re.match(r"\)\s*or vector\(0\)", query[match.end() :]))
        terms.append((match.group(1), labels, defaulted))
    return terms


def check_scaling_metrics(scaled: dict[str, Any], runs: dict[str, Run]) -> None:
    """Each metric a ScaledObject queries is exported, with the queried labels, by a process."""
    exported = [
        httpx.get(f"http://127.0.0.1:{named['metrics']}/metrics").text
        for _, named, _ in runs.values()
    ]
    for trigger in scaled["spec"]["triggers"]:
        for metric, labels, defaulted in queried(trigger["metadata"]["query"]):
            declared = any(f"# TYPE {metric} " in text for text in exported)
            assert declared, f"{metric} is exported by neither the ingress nor the member"
            series = [s for text in exported for s in sample_labels(text, metric)]
            matching = [s for s in series if labels.items() <= s.items()]
            assert matching or defaulted, f"no {metric}{labels} in {series}"


WHATSAPP = """\
sources:
  whatsapp:
    scheme: meta
    secrets: ["env:META_APP_SECRET"]
    tenant: {pointer: /entry/0/id}
    key: {pointer: /entry/0/changes/0/value/contacts/0/wa_id}
    topic: messages
"""


@pytest.mark.usefixtures("redis_service")
def test_the_rendered_ingress_and_consumer_run_mark_scale_and_stop(
    tmp_path: Path, unique: str, log_schema: str
) -> None:
    """Run as rendered: a webhook is handled, its row marked, the KEDA queries answered.

    The ingress and consumer-messages start with their rendered args and variables; both get
    ready on their probes' paths and ports; a webhook sent to the ingress is handled by the
    member and its log row ends `processed` (without it the sweeper replays it); each metric the
    lane's ScaledObject queries is exported with the queried labels by one of the two; and both
    stop on SIGTERM within their terminationGracePeriodSeconds.
    """
    (ingress,) = component("ingress")
    (consumer,) = [d for d in component("consumer") if d["metadata"]["name"] == "consumer-messages"]
    (scaled,) = [
        d for d in k8s_of_kind("ScaledObject") if d["metadata"]["name"] == "consumer-messages"
    ]
    sources = tmp_path / "sources.yaml"
    sources.write_text(WHATSAPP, encoding="utf-8")
    here = load_settings()
    overlay = {  # what an environment's overlay and pipeline-secrets would set
        "PIPELINE_REDIS__KEY_PREFIX": f"k8s{unique}",
        "PIPELINE_INGRESS__POSTGRES_SCHEMA": log_schema,
        "PIPELINE_INGRESS__SOURCES_FILE": str(sources),
        "PIPELINE_POSTGRES__URL": here.postgres.url,
        "PIPELINE_MEMBERSHIP__SLOT_DIR": str(tmp_path / "slots"),
        "META_APP_SECRET": f"secret-{unique}",
    }
    topics = subprocess.run(
        [sys.executable, "-m", "pipeline", "topics", "apply"],
        env=local(environment(pod_spec(consumer)["containers"][0]), {}, overlay),
        capture_output=True,
        check=False,
    )
    assert topics.returncode == 0, topics.stderr.decode()
    runs: dict[str, Run] = {}
    try:
        for deployment in (consumer, ingress):
            runs[deployment["metadata"]["name"]] = start(deployment, overlay, tmp_path)
        url = f"http://127.0.0.1:{runs['ingress'][1]['http']}"
        webhook = ROOT / "deploy/local/webhooks/whatsapp-message.json"
        sent = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline",
                "send",
                "whatsapp",
                "-f",
                str(webhook),
                "--url",
                url,
            ],
            env=local({}, {}, overlay),
            capture_output=True,
            check=False,
        )
        assert sent.returncode == 0, sent.stdout.decode() + sent.stderr.decode()
        state = row_state(here.postgres.url, log_schema)
        member_log = runs["consumer-messages"][2].read_text(encoding="utf-8")
        assert state == "processed", f"the handled webhook's row is {state!r}:\n{member_log}"
        check_scaling_metrics(scaled, runs)
    finally:
        for name, run in runs.items():
            stop(name, run)
