"""Keep a busy member's ``controller.kubernetes.io/pod-deletion-cost`` in step with its work.

When a Deployment scales in, the ReplicaSet controller deletes the pods with the lowest
deletion cost first (a Kubernetes >= 1.22 annotation, best effort). A member that sets its cost
to its in-flight handler count therefore steers scale-in towards idle members, so long handlers
are rarely interrupted; the SIGTERM drain (``RuntimeSettings.shutdown_grace_s``) covers the rest.

:class:`DeletionCost` patches the member's own Pod through the in-cluster API with the
service-account token (RBAC: ``patch`` on ``pods`` in its namespace; see ``deploy/k8s``). It is
active only inside a cluster (:func:`pod_from_environment` finds the Pod), rate-limits itself
(at most one PATCH per ``min_interval_s``, none when the cost is unchanged) and never raises:
a failed PATCH is logged and retried on a later update. The Pod name and namespace come from
the downward API (``POD_NAME``, ``POD_NAMESPACE``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger(__name__)

__all__ = [
    "ANNOTATION",
    "DeletionCost",
    "PodRef",
    "cost_for",
    "patch_body",
    "patch_request",
    "pod_from_environment",
]

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
MAX_COST = 1_000_000
"""Costs are int32 in Kubernetes; keep far below the limit."""
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True, slots=True)
class PodRef:
    """Where this process's own Pod is, and how to reach the API server.

    Attributes:
        namespace: the Pod's namespace.
        name: the Pod's name.
        api_url: the API server, ``https://host:port``.
        token_path: the service-account token (re-read on every PATCH: it rotates).
        ca_path: the cluster CA bundle.
    """

    namespace: str
    name: str
    api_url: str
    token_path: Path = SERVICE_ACCOUNT_DIR / "token"
    ca_path: Path = SERVICE_ACCOUNT_DIR / "ca.crt"


def pod_from_environment(
    env: Mapping[str, str] | None = None, account_dir: Path = SERVICE_ACCOUNT_DIR
) -> PodRef | None:
    """The Pod this process runs in, or None outside a cluster (nothing will be patched)."""
    values = os.environ if env is None else env
    host = values.get("KUBERNETES_SERVICE_HOST")
    port = values.get("KUBERNETES_SERVICE_PORT", "443")
    name = values.get("POD_NAME")
    token = account_dir / "token"
    if not host or not name or not token.exists():
        return None
    namespace = values.get("POD_NAMESPACE")
    if not namespace:
        ns_file = account_dir / "namespace"
        namespace = ns_file.read_text(encoding="utf-8").strip() if ns_file.exists() else "default"
    address = f"[{host}]" if ":" in host else host  # an IPv6 service address
    return PodRef(namespace, name, f"https://{address}:{port}", token, account_dir / "ca.crt")


def cost_for(in_flight: int) -> int:
    """The deletion cost of a member running ``in_flight`` handlers (idle members go first)."""
    return max(0, min(in_flight, MAX_COST))


def patch_body(cost: int) -> dict[str, Any]:
    """The JSON merge patch that sets the annotation to ``cost``."""
    return {"metadata": {"annotations": {ANNOTATION: str(cost)}}}


def patch_request(pod: PodRef, cost: int, token: str) -> httpx.Request:
    """The PATCH of ``pod``'s annotation, authenticated with ``token``."""
    return httpx.Request(
        "PATCH",
        f"{pod.api_url}/api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
        json=patch_body(cost),
        headers={"Authorization": f"Bearer {token}", "Content-Type": MERGE_PATCH},
    )


class DeletionCost:
    """Patches this Pod's deletion cost when the in-flight count changes (rate-limited)."""

    def __init__(
        self,
        pod: PodRef,
        *,
        client: httpx.AsyncClient | None = None,
        min_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Patch ``pod`` with ``client`` (default: one trusting the cluster CA)."""
        self._pod = pod
        self._client = client or httpx.AsyncClient(verify=str(pod.ca_path), timeout=5.0)
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._sent: int | None = None
        self._sent_at = float("-inf")

    async def update(self, in_flight: int, *, force: bool = False) -> bool:
        """Set the cost for ``in_flight`` handlers if it changed and the interval passed.

        ``force`` skips the interval (the member stops and clears its cost).

        Returns:
            True when a PATCH was sent and accepted.
        """
        cost = cost_for(in_flight)
        now = self._clock()
        if cost == self._sent or (not force and now - self._sent_at < self._min_interval_s):
            return False
        self._sent_at = now
        path = self._pod.token_path
        try:
            token = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:  # a token of bytes that are not text too
            log.warning(
                "could not set %s=%d on pod %s: cannot read the service-account token %s: %s",
                ANNOTATION,
                cost,
                self._pod.name,
                path,
                exc,
            )
            return False
        try:
            response = await self._client.send(patch_request(self._pod, cost, token))
            response.raise_for_status()
        except (OSError, httpx.HTTPError) as exc:
            log.warning("could not set %s=%d on pod %s: %s", ANNOTATION, cost, self._pod.name, exc)
            return False
        self._sent = cost
        return True

    async def close(self) -> None:
        """Release the HTTP client."""
        await self._client.aclose()
