"""The pod-deletion-cost patch: its body, its request, and when it is sent."""

from __future__ import annotations

import json

import httpx

from pipeline.observability.deletion_cost import (
    ANNOTATION,
    DeletionCost,
    PodRef,
    cost_for,
    patch_body,
    patch_request,
    pod_from_environment,
)


def test_patch_body_sets_only_the_annotation():
    """The merge patch touches nothing but the deletion-cost annotation, as a string."""
    assert patch_body(7) == {"metadata": {"annotations": {ANNOTATION: "7"}}}


def test_cost_grows_with_in_flight_work_and_is_bounded():
    """Idle members cost 0 and go first; the cost never leaves the int32 range."""
    assert cost_for(0) == 0
    assert cost_for(-3) == 0
    assert cost_for(12) == 12
    assert cost_for(10**12) < 2**31


def test_patch_request_targets_the_own_pod_with_a_merge_patch(tmp_path):
    """The request is a JSON merge PATCH of the Pod, authenticated with the token."""
    pod = PodRef("pipeline", "consumer-messages-abc", "https://10.0.0.1:6443")
    request = patch_request(pod, 3, "tok")
    assert request.method == "PATCH"
    assert str(request.url) == (
        "https://10.0.0.1:6443/api/v1/namespaces/pipeline/pods/consumer-messages-abc"
    )
    assert request.headers["content-type"] == "application/merge-patch+json"
    assert request.headers["authorization"] == "Bearer tok"
    assert json.loads(request.content) == patch_body(3)


def test_outside_a_cluster_there_is_no_pod(tmp_path):
    """Without the service host, the Pod name or a token, nothing is patched."""
    assert pod_from_environment({}, tmp_path) is None
    assert pod_from_environment({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, tmp_path) is None


def test_inside_a_cluster_the_pod_comes_from_the_downward_api(tmp_path):
    """Host, port, Pod name and the namespace file make the Pod reference."""
    (tmp_path / "token").write_text("tok")
    (tmp_path / "namespace").write_text("prod\n")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443", "POD_NAME": "p"}
    pod = pod_from_environment(env, tmp_path)
    assert pod is not None
    assert (pod.namespace, pod.name, pod.api_url) == ("prod", "p", "https://[fd00::1]:6443")


async def test_updates_are_sent_on_change_and_rate_limited(tmp_path):
    """A change is sent once; an unchanged cost or one within the interval is not sent."""
    (tmp_path / "token").write_text("tok")
    sent: list[dict[str, object]] = []

    def api(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={})

    now = [100.0]
    pod = PodRef("ns", "p", "https://k8s", token_path=tmp_path / "token")
    client = httpx.AsyncClient(transport=httpx.MockTransport(api))
    cost = DeletionCost(pod, client=client, min_interval_s=5.0, clock=lambda: now[0])
    try:
        assert await cost.update(4)
        assert not await cost.update(4)  # unchanged
        assert not await cost.update(9)  # too soon
        now[0] += 5.0
        assert await cost.update(9)
    finally:
        await cost.close()
    assert sent == [patch_body(4), patch_body(9)]


async def test_a_refused_patch_is_logged_not_raised(tmp_path):
    """An API error (RBAC missing) never reaches the member; the next change tries again."""
    (tmp_path / "token").write_text("tok")
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(403)))
    pod = PodRef("ns", "p", "https://k8s", token_path=tmp_path / "token")
    cost = DeletionCost(pod, client=client, min_interval_s=0.0)
    try:
        assert not await cost.update(2)
        assert not await cost.update(2)  # not recorded as sent, so it is tried again
    finally:
        await cost.close()


async def test_a_token_that_is_not_text_is_logged_not_raised(tmp_path, caplog):
    """A token file of bytes that are not UTF-8 fails the patch with a warning, never raises."""
    (tmp_path / "token").write_bytes(b"\xff\xfe-not-utf8")
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(200)))
    pod = PodRef("ns", "p", "https://k8s", token_path=tmp_path / "token")
    cost = DeletionCost(pod, client=client, min_interval_s=0.0)
    try:
        assert not await cost.update(2)
    finally:
        await cost.close()
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert str(tmp_path / "token") in line
