"""An app whose ``cpu=True`` handler starts a child and then spins, deaf to SIGTERM.

For the tests of what becomes of a worker whose member is gone. The lane comes from
``SPINNING_TOPIC``; the handler pushes ``<worker pid>:<child pid>`` onto the Redis list
``SPINNING_STARTED`` before it spins.
"""

from __future__ import annotations

import os
import subprocess

import redis

from pipeline.runtime import App, Context
from pipeline.topics.spec import TopicSpec

spec = TopicSpec.model_validate(
    {"name": os.environ["SPINNING_TOPIC"], "partitions": 1, "ordered": False}
)
app = App([spec])


@app.handler(spec.lane, cpu=True, time_limit_s=600)
def spin(event: bytes, ctx: Context) -> None:
    """Start ``sleep 600``, record both pids, then burn CPU for ever (only SIGKILL ends it)."""
    child = subprocess.Popen(["sleep", "600"])
    client = redis.Redis.from_url(os.environ.get("PIPELINE_REDIS__URL", "redis://127.0.0.1:6379/0"))
    try:
        client.rpush(os.environ["SPINNING_STARTED"], f"{os.getpid()}:{child.pid}")
    finally:
        client.close()
    while True:  # never looks at ctx.cancelled
        pass
