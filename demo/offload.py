"""The demo's large bodies: offloaded to S3Proxy when it runs, inline when it does not.

About 2% of the traffic's customer messages carry an attachment-sized body (384 KiB, above
the 256 KiB threshold). When S3Proxy answers (``make services`` starts it on 127.0.0.1:9000),
the run declares ``offload:`` on its ``messages`` lane, in a copy of ``topics/`` under the
run's output directory (``s3://pipeline/demo-<run>``), so the ingress writes those bodies to
S3Proxy and the broker carries references; the summary counts the objects, which are deleted
at the end. Without S3Proxy the same bodies travel inline (they are under the broker's 1 MiB)
and the run says so in one line.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

import yaml

from pipeline.offload.store import open_store

LANE = "messages"
"""The lane whose large bodies go to the store."""
BUCKET = "pipeline"
S3PROXY = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_ACCESS_KEY_ID": "pipeline",
    "AWS_SECRET_ACCESS_KEY": "pipeline-local-secret",
}
"""What deploy/local/s3proxy.sh configures; the environment wins when it names another."""


def s3_environment() -> dict[str, str]:
    """The ``AWS_*`` variables of the store: the environment's, else the local S3Proxy's."""
    return {name: os.environ.get(name) or value for name, value in S3PROXY.items()}


def s3proxy_running(environment: dict[str, str]) -> bool:
    """Whether the S3 endpoint of ``environment`` accepts a connection."""
    endpoint = urlparse(environment["AWS_ENDPOINT_URL"])
    try:
        with socket.create_connection((endpoint.hostname or "127.0.0.1", endpoint.port or 80), 1):
            return True
    except OSError:
        return False


def offloading_topics(topics: Path, into: Path, store: str) -> Path:
    """A copy of ``topics`` in ``into`` whose ``messages`` lane offloads to ``store``."""
    into.mkdir(parents=True, exist_ok=True)
    for stale in into.glob("*.yaml"):
        stale.unlink()
    for path in sorted(topics.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        if doc.get("lane", doc.get("name")) == LANE:
            doc["offload"] = {"above": "256KiB", "store": store}
        (into / path.name).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return into


async def stored(store: str) -> tuple[int, int]:
    """Objects in ``store`` and their bytes."""
    found = [obj async for obj in open_store(store).list()]
    return len(found), sum(obj.size for obj in found)


async def empty(store: str) -> None:
    """Delete every object of ``store`` (the run's prefix)."""
    payloads = open_store(store)
    for key in [obj.key async for obj in payloads.list()]:
        await payloads.delete(key)
