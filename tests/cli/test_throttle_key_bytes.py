"""`pipeline throttle status` given a key with command-line bytes that are not UTF-8."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from redis.asyncio import Redis

from pipeline.admission.throttle import Throttle


async def test_status_of_a_key_not_utf8_shows_its_limit(redis_service: str, unique: str) -> None:
    """`throttle status` of a key that is not UTF-8 shows the limit set for it, no traceback."""
    key = b"org:a\xffb".decode(errors="surrogateescape")  # as Python hands `$'org:a\xffb'` over
    namespace = f"b{unique}"
    client = Redis.from_url(redis_service)
    throttle = Throttle(client, namespace=namespace, default_limit=1)
    try:
        await throttle.set_limit(key, 3)  # as `pipeline throttle set-limit` sets it
    finally:
        await throttle.close()
        await client.aclose()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pipeline",
        "throttle",
        "status",
        key,
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={
            **os.environ,
            "PIPELINE_REDIS__URL": redis_service,
            "PIPELINE_THROTTLE__NAMESPACE": namespace,
        },
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, stderr.decode(errors="replace")
    assert json.loads(stdout)["limit"] == 3
