"""deploy/k8s validates offline, scales on age and slots (never CPU), and deploys every lane."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pipeline.config import RuntimeSettings
from pipeline.runtime.member import longest_stop_s
from pipeline.topics.spec import TopicSpec, load_specs
from scripts import manifests
from scripts.manifests import AGE_TARGET_S, lane_manifests

ROOT = Path(__file__).parents[2]
K8S = ROOT / "deploy" / "k8s"
VERSION = kubernetes_validate.latest_version()


def documents() -> list[tuple[str, dict[str, Any]]]:
    """Every manifest below deploy/k8s with its file, kustomizations excluded."""
    found = []
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs = yaml.safe_load_all(path.read_text(encoding="utf-8"))
        found.extend((str(path.relative_to(K8S)), doc) for doc in docs if doc)
    return found


def of_kind(kind: str) -> list[dict[str, Any]]:
    """The manifests of one kind."""
    return [doc for _, doc in documents() if doc["kind"] == kind]


def ident(item: tuple[str, dict[str, Any]]) -> str:
    """A test id: file, kind and name."""
    path, doc = item
    return f"{path}:{doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize(
    "item", [i for i in documents() if i[1]["kind"] != "ScaledObject"], ids=ident
)
def test_manifest_validates_against_the_kubernetes_schema(item):
    """Each built-in resource validates strictly (no unknown fields) against bundled schemas."""
    kubernetes_validate.validate(item[1], VERSION, strict=True)


def test_the_validator_rejects_a_broken_deployment():
    """The schema check is real: an unknown field and a wrong type are refused."""
    deployment = copy.deepcopy(of_kind("Deployment")[0])
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSION, strict=True)
    deployment = copy.deepcopy(of_kind("Deployment")[0])
    deployment["spec"]["template"]["spec"]["terminationGrace"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSION, strict=True)


def test_kustomizations_list_existing_resources():
    """Every resource a kustomization.yaml names exists, and every manifest is listed."""
    listed: set[Path] = set()
    for kustomization in K8S.rglob("kustomization.yaml"):
        for resource in yaml.safe_load(kustomization.read_text(encoding="utf-8"))["resources"]:
            target = (kustomization.parent / resource).resolve()
            assert target.exists(), f"{kustomization}: {resource} does not exist"
            listed.add(target)
    for path in K8S.rglob("*.yaml"):
        if path.name != "kustomization.yaml":
            assert path.resolve() in listed, f"{path} is not in any kustomization.yaml"


def deployment_names() -> set[str]:
    """Names of the Deployments."""
    return {doc["metadata"]["name"] for doc in of_kind("Deployment")}


def test_scaled_objects_have_keda_required_fields_and_never_use_cpu():
    """ScaledObjects target a Deployment, bound replicas and trigger on lag/age/slots, not CPU."""
    scaled = of_kind("ScaledObject")
    assert scaled
    for doc in scaled:
        assert doc["apiVersion"] == "keda.sh/v1alpha1"
        spec = doc["spec"]
        assert spec["scaleTargetRef"]["name"] in deployment_names()
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        assert spec["triggers"]
        for trigger in spec["triggers"]:
            assert trigger["type"] not in {"cpu", "memory"}
            assert trigger["type"] in {"prometheus", "kafka", "redis-streams"}
            metadata = trigger["metadata"]
            if trigger["type"] == "prometheus":
                assert {"serverAddress", "query", "threshold"} <= set(metadata)
                assert float(metadata["threshold"]) > 0
                assert "cpu" not in metadata["query"]


def consumer_deployments() -> list[dict[str, Any]]:
    """The consumer-group Deployments."""
    return [
        doc
        for doc in of_kind("Deployment")
        if doc["metadata"]["labels"].get("app.kubernetes.io/component") == "consumer"
    ]


def test_termination_grace_covers_the_longest_shutdown():
    """A consumer pod outlasts its member's longest shutdown, with room to commit and leave.

    The member waits up to the handler grace, then the cancel grace and its margin for what it
    cancelled (docs/runtime.md); the kubelet must not SIGKILL it before it commits.
    """
    for doc in consumer_deployments():
        pod = doc["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0].get("env", [])}
        runtime = RuntimeSettings()
        for name, field in (
            ("PIPELINE_RUNTIME__SHUTDOWN_GRACE_S", "shutdown_grace_s"),
            ("PIPELINE_RUNTIME__CANCEL_GRACE_S", "cancel_grace_s"),
        ):
            if env.get(name):
                runtime = runtime.model_copy(update={field: float(env[name])})
        longest_s = longest_stop_s(runtime)
        assert pod["terminationGracePeriodSeconds"] >= longest_s + 5  # room to commit and leave


def test_a_longer_cancel_grace_lengthens_the_pod_grace():
    """Manifests rendered with a raised cancel grace give the pod that much longer, and say it."""
    runtime = RuntimeSettings(cancel_grace_s=60)
    for name, text in manifests.render_all(load_specs(ROOT / "topics"), runtime).items():
        for doc in yaml.safe_load_all(text):
            if doc and doc["kind"] == "Deployment":
                pod = doc["spec"]["template"]["spec"]
                env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
                assert env["PIPELINE_RUNTIME__CANCEL_GRACE_S"] == "60", name
                assert pod["terminationGracePeriodSeconds"] >= longest_stop_s(runtime) + 5, name


def test_every_deployment_has_a_disruption_budget():
    """Each Deployment's pods are covered by a PodDisruptionBudget with the same selector."""
    budgets = [doc["spec"]["selector"]["matchLabels"] for doc in of_kind("PodDisruptionBudget")]
    for doc in of_kind("Deployment"):
        assert doc["spec"]["selector"]["matchLabels"] in budgets, doc["metadata"]["name"]


def test_every_declared_lane_has_a_consumer_group_deployment():
    """A lane routed to but consumed by no group strands its messages: every lane is deployed."""
    lanes = {spec.lane for spec in load_specs(ROOT / "topics")}
    deployed: dict[str, list[str]] = {}
    for doc in consumer_deployments():
        args = doc["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[0] == "consume"
        lane = args[args.index("--lane") + 1]
        deployed[lane] = args
        assert args[args.index("--group") + 1], "a consumer needs its group"
        module = args[1].partition(":")[0]
        assert (ROOT / (module.replace(".", "/") + ".py")).exists(), f"{module} is missing"
    assert lanes <= set(deployed), f"lanes without a consumer group: {lanes - set(deployed)}"


def test_consumer_probes_and_deletion_cost_permissions():
    """Consumers are probed on /readyz and /healthz and may patch their Pod's deletion cost."""
    role = of_kind("Role")[0]
    assert {"patch"} <= set(role["rules"][0]["verbs"])
    accounts = {doc["metadata"]["name"] for doc in of_kind("ServiceAccount")}
    for doc in consumer_deployments():
        pod = doc["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] in accounts
        container = pod["containers"][0]
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        env = {e["name"] for e in container["env"]}
        assert {"POD_NAME", "POD_NAMESPACE"} <= env


def test_consumers_leave_reaping_to_the_pods_pause_process():
    """Not PID 1 in a consumer's pod, pipeline leaves reaping what killed handlers started.

    As PID 1 it would inherit every process a cpu=True handler started and a timeout or a
    cancellation killed, and reap none: each stays <defunct>, holding a pid of the pod's limit.
    """
    for doc in consumer_deployments():
        assert doc["spec"]["template"]["spec"]["shareProcessNamespace"] is True


def test_a_batch_lane_scales_on_age_only_past_its_promotion_point():
    """Batch work waits for idle capacity by design: it asks for members near its SLA only."""
    batch = TopicSpec.model_validate(
        {"name": "reindex", "partitions": 4, "batch": {"sla": "12h", "promote_at": 0.75}}
    )
    interactive = TopicSpec.model_validate({"name": "replies", "partitions": 4})
    runtime = RuntimeSettings()

    def age_threshold(spec: TopicSpec) -> float:
        *_, scaled = lane_manifests(spec.lane, [spec], runtime)
        (age,) = [t for t in scaled["spec"]["triggers"] if "_age_" in t["metadata"]["query"]]
        return float(age["metadata"]["threshold"])

    assert age_threshold(batch) == 9 * 3600
    assert age_threshold(interactive) == AGE_TARGET_S


def test_a_scaled_deployment_leaves_its_replica_count_to_the_autoscaler():
    """A Deployment a ScaledObject scales names no ``replicas``, so an apply keeps the fleet.

    With the field in the manifest, each ``kubectl apply`` of any change would set the count back
    to it (Kubernetes' advice for a workload under an HPA), mid-burst, and KEDA would scale it up
    again: two rebalances of the group for a config change.
    """
    scaled = {doc["spec"]["scaleTargetRef"]["name"] for doc in of_kind("ScaledObject")}
    assert scaled, "no ScaledObject rendered"
    deployments = {doc["metadata"]["name"]: doc for doc in of_kind("Deployment")}
    for name in scaled:
        assert "replicas" not in deployments[name]["spec"], name
    for name in set(deployments) - scaled:
        assert deployments[name]["spec"]["replicas"] >= 1, name
