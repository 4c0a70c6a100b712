"""The rendered manifests meet the "restricted" Pod Security Standard and pin images by digest.

`kubectl kustomize deploy/k8s` renders what `kubectl apply -k` would send. Each control of the
restricted profile (https://kubernetes.io/docs/concepts/security/pod-security-standards/, the
baseline controls included) is one rule below, checked on every pod template; then the network
policies, RBAC, resources and the registry's single store.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from support import k8s_of_kind, rendered_k8s

ROOT = Path(__file__).parents[2]
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"}
DIGEST = re.compile(r"^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+@sha256:[0-9a-f]{64}$")
ALLOWED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
Pod = dict[str, Any]


def workloads() -> list[dict[str, Any]]:
    """Every rendered object that carries a pod template."""
    return [doc for doc in rendered_k8s() if doc["kind"] in WORKLOADS]


def template(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod template of a workload (a CronJob's is inside its job template)."""
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]  # type: ignore[no-any-return]


def containers(pod: Pod) -> Iterator[dict[str, Any]]:
    """Containers, init containers and ephemeral containers of a pod spec."""
    for field in ("containers", "initContainers", "ephemeralContainers"):
        yield from pod.get(field, [])


def either(pod: Pod, container: dict[str, Any], key: str) -> Any:
    """A securityContext field of the container, else of the pod (the container's wins)."""
    own = container.get("securityContext", {})
    return own[key] if key in own else pod.get("securityContext", {}).get(key)


# Each rule returns its violations in one pod spec: empty when the pod complies.
def host_namespaces(pod: Pod) -> list[str]:
    """Baseline: no host network, PID or IPC namespace."""
    return [f for f in ("hostNetwork", "hostPID", "hostIPC") if pod.get(f)]


def no_privileged(pod: Pod) -> list[str]:
    """Baseline: no privileged container and no Windows host process."""
    bad = [c["name"] for c in containers(pod) if c.get("securityContext", {}).get("privileged")]
    bad += [c["name"] for c in containers(pod) if either(pod, c, "windowsOptions")]
    return bad


def capabilities(pod: Pod) -> list[str]:
    """Restricted: every container drops ALL and adds nothing but NET_BIND_SERVICE."""
    bad = []
    for c in containers(pod):
        caps = c.get("securityContext", {}).get("capabilities", {})
        if "ALL" not in caps.get("drop", []) or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(c["name"])
    return bad


def volume_types(pod: Pod) -> list[str]:
    """Restricted: only configMap, csi, downwardAPI, emptyDir, ephemeral, PVC, projected, secret."""
    return [v["name"] for v in pod.get("volumes", []) if not set(v) - {"name"} <= ALLOWED_VOLUMES]


def host_ports(pod: Pod) -> list[str]:
    """Baseline: no container port bound on the host."""
    return [c["name"] for c in containers(pod) for p in c.get("ports", []) if p.get("hostPort")]


def apparmor(pod: Pod) -> list[str]:
    """Baseline: AppArmor unset, RuntimeDefault or Localhost."""
    contexts = [pod.get("securityContext", {})]
    contexts += [c.get("securityContext", {}) for c in containers(pod)]
    kinds = [ctx.get("appArmorProfile", {}).get("type") for ctx in contexts]
    return [k for k in kinds if k not in {None, "RuntimeDefault", "Localhost"}]


def selinux(pod: Pod) -> list[str]:
    """Baseline: SELinux type limited to the container types, no custom user or role."""
    contexts = [pod.get("securityContext", {})]
    contexts += [c.get("securityContext", {}) for c in containers(pod)]
    bad = []
    for ctx in contexts:
        options = ctx.get("seLinuxOptions", {})
        if options.get("type") not in {
            None,
            "",
            "container_t",
            "container_init_t",
            "container_kvm_t",
        }:
            bad.append(options["type"])
        bad += [options[k] for k in ("user", "role") if options.get(k)]
    return bad


def proc_mount(pod: Pod) -> list[str]:
    """Baseline: the default /proc mount."""
    return [
        c["name"]
        for c in containers(pod)
        if c.get("securityContext", {}).get("procMount", "Default") != "Default"
    ]


def seccomp(pod: Pod) -> list[str]:
    """Restricted: seccomp RuntimeDefault or Localhost, set on the pod or on every container."""
    bad = []
    for c in containers(pod):
        profile = either(pod, c, "seccompProfile") or {}
        if profile.get("type") not in {"RuntimeDefault", "Localhost"}:
            bad.append(c["name"])
    return bad


def sysctls(pod: Pod) -> list[str]:
    """Baseline: only the namespaced, safe sysctls."""
    found = pod.get("securityContext", {}).get("sysctls", [])
    return [s["name"] for s in found if s["name"] not in SAFE_SYSCTLS]


def no_escalation(pod: Pod) -> list[str]:
    """Restricted: allowPrivilegeEscalation is false on every container."""
    return [
        c["name"]
        for c in containers(pod)
        if c.get("securityContext", {}).get("allowPrivilegeEscalation") is not False
    ]


def non_root(pod: Pod) -> list[str]:
    """Restricted: runAsNonRoot true (pod or every container), and no runAsUser 0."""
    bad = [c["name"] for c in containers(pod) if either(pod, c, "runAsNonRoot") is not True]
    contexts = [pod.get("securityContext", {})]
    contexts += [c.get("securityContext", {}) for c in containers(pod)]
    bad += ["runAsUser: 0" for ctx in contexts if ctx.get("runAsUser") == 0]
    return bad


def read_only_root(pod: Pod) -> list[str]:
    """Beyond the profile (the issue asks for it): every root filesystem is read-only."""
    return [
        c["name"]
        for c in containers(pod)
        if c.get("securityContext", {}).get("readOnlyRootFilesystem") is not True
    ]


RULES: dict[str, Callable[[Pod], list[str]]] = {
    rule.__name__: rule
    for rule in (
        host_namespaces, no_privileged, capabilities, volume_types, host_ports, apparmor,
        selinux, proc_mount, seccomp, sysctls, no_escalation, non_root, read_only_root,
    )
}  # fmt: skip


def workload_names() -> list[str]:
    """Kind/name of every workload (parameter ids)."""
    try:
        return [f"{d['kind']}/{d['metadata']['name']}" for d in workloads()]
    except (pytest.skip.Exception, pytest.fail.Exception):
        return ["unrendered"]


def pod_of(name: str) -> Pod:
    """The pod spec of the workload ``Kind/name``."""
    kind, _, plain = name.partition("/")
    (doc,) = [d for d in k8s_of_kind(kind) if d["metadata"]["name"] == plain]
    return template(doc)["spec"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("workload", workload_names())
def test_every_pod_template_meets_the_restricted_profile(workload, rule):
    """Each restricted-profile control holds for each rendered pod template."""
    assert RULES[rule](pod_of(workload)) == []


def test_the_rules_catch_a_pod_that_breaks_them():
    """Each rule finds its violation in a deliberately bad pod (the checks are not vacuous)."""
    good = pod_of(workload_names()[0])
    assert all(rule(good) == [] for rule in RULES.values())
    bad = copy.deepcopy(good)
    container = bad["containers"][0]
    bad |= {"hostNetwork": True, "securityContext": {"runAsUser": 0}}
    bad["securityContext"]["sysctls"] = [{"name": "kernel.msgmax", "value": "1"}]
    bad["securityContext"]["seLinuxOptions"] = {"type": "spc_t"}
    bad["securityContext"]["appArmorProfile"] = {"type": "Unconfined"}
    bad.setdefault("volumes", []).append({"name": "host", "hostPath": {"path": "/"}})
    container["ports"] = [{"containerPort": 80, "hostPort": 80}]
    container["securityContext"] = {
        "privileged": True,
        "procMount": "Unmasked",
        "capabilities": {"add": ["SYS_ADMIN"]},
    }
    assert {name for name, rule in RULES.items() if rule(bad)} == set(RULES)


def test_the_namespace_enforces_the_restricted_profile():
    """The API server itself refuses a non-compliant pod in the namespace."""
    (namespace,) = k8s_of_kind("Namespace")
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    names = {
        doc["metadata"].get("namespace") for doc in rendered_k8s() if doc["kind"] != "Namespace"
    }
    assert names <= {namespace["metadata"]["name"], None}


def test_every_image_is_pinned_by_digest():
    """No container image is a floating tag: each is registry/path@sha256:<64 hex>."""
    images = [c["image"] for w in workloads() for c in containers(template(w)["spec"])]
    assert len(images) >= 5
    assert [i for i in images if not DIGEST.match(i)] == []


def test_every_rendered_object_validates():
    """The rendered objects (namespaced, digests set) validate strictly against the schemas."""
    version = kubernetes_validate.latest_version()
    for doc in rendered_k8s():
        if doc["kind"] != "ScaledObject":
            kubernetes_validate.validate(doc, version, strict=True)


def test_every_container_has_requests_and_a_memory_limit():
    """CPU and memory requests and a memory limit on every container (no CPU limit: throttling)."""
    for w in workloads():
        for c in containers(template(w)["spec"]):
            resources = c["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), w["metadata"]["name"]
            assert "memory" in resources["limits"], w["metadata"]["name"]


def test_every_workload_has_a_disruption_budget():
    """Each long-running workload's pods are covered by a PodDisruptionBudget of its selector.

    A CronJob's runs are not: an evicted run is retried, or left to the next day's.
    """
    budgets = [d["spec"]["selector"]["matchLabels"] for d in k8s_of_kind("PodDisruptionBudget")]
    for w in workloads():
        if w["kind"] != "CronJob":
            assert w["spec"]["selector"]["matchLabels"] in budgets, w["metadata"]["name"]


def component(name: str) -> dict[str, Any]:
    """The Deployment of a component."""
    (doc,) = [
        d
        for d in k8s_of_kind("Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == name
    ]
    return doc


def test_only_consumers_get_an_api_token_and_they_may_only_patch_pods():
    """Ingress and registry mount no token; consumers' Role is `patch` on pods, nothing else."""
    for name in ("ingress", "registry"):
        pod = component(name)["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["serviceAccountName"] != "pipeline-consumer"
    (role,) = k8s_of_kind("Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
    (binding,) = k8s_of_kind("RoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "pipeline-consumer", "namespace": "pipeline"}
    ]
    assert k8s_of_kind("ClusterRoleBinding") == []


def test_consumers_may_patch_only_their_own_pods_deletion_cost():
    """The admission policy ties a consumer's patch to its own Pod name and one annotation."""
    (policy,) = k8s_of_kind("ValidatingAdmissionPolicy")
    (binding,) = k8s_of_kind("ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert "pipeline-consumer" in spec["matchConditions"][0]["expression"]
    own, only = (v["expression"] for v in spec["validations"])
    assert "authentication.kubernetes.io/pod-name" in own
    assert "object.metadata.name" in own
    assert "object.spec == oldObject.spec" in only
    assert "pod-deletion-cost" in spec["variables"][0]["expression"]


def policy_for(component_name: str | None) -> list[dict[str, Any]]:
    """The ingress rules of the policies selecting pods with that component label."""
    rules = []
    for doc in k8s_of_kind("NetworkPolicy"):
        labels = doc["spec"]["podSelector"].get("matchLabels", {})
        if component_name is None or labels.get("app.kubernetes.io/component") == component_name:
            rules.extend(doc["spec"].get("ingress", []))
    return rules


def test_network_policies_open_only_the_webhook_port_to_the_world():
    """Default deny; the webhook port is open; registry, metrics and Redis only from inside."""
    deny = [d for d in k8s_of_kind("NetworkPolicy") if d["spec"]["podSelector"] == {}]
    assert deny
    assert deny[0]["spec"]["policyTypes"] == ["Ingress"]
    assert "ingress" not in deny[0]["spec"]
    from_anywhere = [
        (d["metadata"]["name"], p["port"])
        for d in k8s_of_kind("NetworkPolicy")
        for rule in d["spec"].get("ingress", [])
        if "from" not in rule
        for p in rule["ports"]
    ]
    assert from_anywhere == [("ingress-webhooks", "http")]
    inside = {"podSelector": {}}
    prometheus = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    }
    for doc in k8s_of_kind("NetworkPolicy"):
        for rule in doc["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                assert peer in (inside, prometheus), doc["metadata"]["name"]
                if peer == prometheus:
                    assert [p["port"] for p in rule["ports"]] == ["metrics"]
    selected = {
        doc["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/name")
        for doc in k8s_of_kind("NetworkPolicy")
    }
    assert "redis" in selected


def test_metrics_have_a_port_of_their_own():
    """Every workload scrapes a `metrics` port apart from its webhook port; Services hide it."""
    for w in workloads():
        pod_template = template(w)
        annotations = pod_template["metadata"].get("annotations", {})
        if "prometheus.io/port" not in annotations:
            continue
        (container,) = pod_template["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == int(annotations["prometheus.io/port"])
        assert list(ports.values()).count(ports["metrics"]) == 1
        assert container["readinessProbe"]["httpGet"]["port"] == "metrics"
    ingress = component("ingress")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in ingress["env"]}
    assert env["PIPELINE_INGRESS__METRICS_PORT"] == "9100"
    for service in k8s_of_kind("Service"):
        assert all(p["targetPort"] != "metrics" for p in service["spec"]["ports"])


def test_the_registry_has_one_store_and_auth_on():
    """Registry replicas name their count, share a required PostgreSQL secret and require auth."""
    registry = component("registry")
    container = registry["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["PIPELINE_REGISTRY__REPLICAS"]["value"] == str(registry["spec"]["replicas"])
    assert env["PIPELINE_REGISTRY__REQUIRE_AUTH"]["value"] == "true"
    for name in ("PIPELINE_REGISTRY__STORE", "PIPELINE_REGISTRY__AUTH__USERS"):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref.get("optional", False) is False
    assert all(not ref.get("secretRef", {}).get("optional") for ref in container["envFrom"])
    config = {d["metadata"]["name"]: d for d in k8s_of_kind("ConfigMap")}["pipeline-config"]
    assert not any(k.startswith("PIPELINE_REGISTRY__STORE") for k in config["data"])


def test_the_ingress_log_is_purged_daily_by_a_job_that_changes_nothing_else():
    """A CronJob runs `pipeline purge --older-than 30d` daily, one run at a time, no API token."""
    (job,) = [d for d in k8s_of_kind("CronJob") if d["metadata"]["name"] == "log-purge"]
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    pod = template(job)["spec"]
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["args"] == ["purge", "--older-than", "30d"]
    assert {e["configMapRef"]["name"] for e in container["envFrom"] if "configMapRef" in e} == {
        "pipeline-config"
    }
