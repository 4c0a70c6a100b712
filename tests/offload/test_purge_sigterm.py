"""`pipeline offload purge` stopped by SIGTERM (a CronJob's pod stopped) says how far it got."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.offload.store import open_store

COUNT = 1500
"""Objects to purge: S3Proxy deletes them for several seconds, so the signal comes meanwhile."""


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
async def test_a_purge_stopped_by_sigterm_prints_its_lines_and_exits_143(
    store_url: str, tmp_path: Path, redis_service: str
) -> None:
    """SIGTERM mid-purge prints the store's line (``"interrupted": true``) and one stderr line."""
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "up.yaml").write_text(
        yaml.safe_dump({"name": "up", "partitions": 1, "offload": {"store": store_url}})
    )
    store = open_store(store_url)
    keys = [f"sha256/{n % 256:02x}/{n:064x}" for n in range(COUNT)]
    writing = asyncio.Semaphore(32)

    async def put(key: str) -> None:
        async with writing:
            await store.put(key, b"p")

    await asyncio.gather(*(put(key) for key in keys))
    first = min(keys)  # the purge deletes in its listing's order, which S3 sorts by key
    env = {
        **os.environ,
        "PIPELINE_TOPICS_DIR": str(topics),
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": redis_service,
    }
    # Objects just written: only an age of 1 ms (--force, below the floor) reaches them.
    command = ["offload", "purge", "--store", store_url, "--older-than", "1ms", "--force"]
    pipe = asyncio.subprocess.PIPE
    purging = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pipeline", *command, env=env, stdout=pipe, stderr=pipe
    )
    try:
        deadline = time.monotonic() + 60
        while await store.head(first) is not None:  # stopped once it has deleted something
            assert purging.returncode is None, await purging.communicate()
            assert time.monotonic() < deadline, "the purge deleted nothing in 60 s"
            await asyncio.sleep(0.01)
        purging.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(purging.communicate(), 60)
    finally:
        if purging.returncode is None:
            purging.kill()
            await purging.communicate()
    stdout, stderr = out.decode(), err.decode()
    assert purging.returncode == 143, (stdout, stderr)
    assert "Traceback" not in stderr, stderr
    left = len([obj async for obj in store.list("sha256/")])
    line = json.loads(stdout)
    assert line["store"] == store_url
    assert line["interrupted"] is True
    # The first object is gone; its delete may have been under way (done by the store, its
    # answer not yet counted) when the signal came, so the count may be one short.
    assert COUNT - left >= 1
    assert line["deleted"] <= COUNT - left <= line["deleted"] + 1
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "stopped by SIGTERM" in stderr
    assert "run it again" in stderr
