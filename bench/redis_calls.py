"""What one Redis Functions call costs the caller's CPU: through redis-py, and through the channel.

Run: ``make bench-redis-calls`` (= ``.venv/bin/python bench/redis_calls.py``), Redis from
``PIPELINE_REDIS__URL``. A one-function library (it returns its argument) is loaded under a
uuid-named library; ``--calls`` calls (default 5,000) are made one after the other through
:class:`~pipeline.redis_functions.FunctionLibrary` on a redis-py client configured as ``pipeline
consume`` configures its own, first without and then with a
:class:`~pipeline.redis_channel.FunctionChannel` bound to it, and then in groups of 100 at once
through the channel. CPU is this process's (``time.process_time``) per call; the library is
deleted afterwards. The last line is one JSON object::

    {"bench": "redis_calls", "redis_py_us": ..., "channel_us": ..., "channel_concurrent_us": ...,
     "channel_vs_redis_py": ...}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

from redis import exceptions as rexc

from pipeline.config import load_settings
from pipeline.redis_channel import open_channel
from pipeline.redis_functions import FunctionLibrary
from pipeline.runtime.run import redis_client

GROUP = 100


async def _cpu_per_call(calls: int, make: Callable[[int], Awaitable[object]]) -> float:
    started = time.process_time()
    for i in range(calls):
        await make(i)
    return (time.process_time() - started) / calls * 1e6


async def run(calls: int) -> dict[str, object]:
    """Time the calls; the figures in microseconds of CPU per call."""
    settings = load_settings()
    client = redis_client(settings)
    name = f"pl_bench_calls_{uuid.uuid4().hex[:10]}"
    library = FunctionLibrary(
        client,
        f"#!lua name={name}\nredis.register_function('echo', function(k, a) return a[1] end)\n",
    )
    channel = None
    try:
        try:
            await library.fcall("echo", [], ["warm"])
        except (rexc.RedisError, OSError) as exc:
            where = f"{settings.redis.url} (PIPELINE_REDIS__URL)"
            raise SystemExit(f"Redis unreachable at {where}: {exc}") from None
        redis_py = await _cpu_per_call(calls, lambda i: library.fcall("echo", [], [i]))
        channel = open_channel(client)
        if channel is None:
            raise SystemExit(
                f"no function channel for {settings.redis.url} (TLS, a socket or RESP3)"
            )
        await library.fcall("echo", [], ["warm"])
        sequential = await _cpu_per_call(calls, lambda i: library.fcall("echo", [], [i]))

        async def group(_i: int) -> object:
            return await asyncio.gather(*(library.fcall("echo", [], [j]) for j in range(GROUP)))

        concurrent = await _cpu_per_call(max(1, calls // GROUP), group) / GROUP
    finally:
        if channel is not None:
            await channel.aclose()
        await client.function_delete(f"{name}_{library.version}")
        await client.aclose()
    return {
        "bench": "redis_calls",
        "redis_py_us": round(redis_py, 1),
        "channel_us": round(sequential, 1),
        "channel_concurrent_us": round(concurrent, 1),
        "channel_vs_redis_py": round(sequential / redis_py, 3),
        "calls": calls,
    }


def main() -> int:
    """Parse the arguments, run, print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    result = asyncio.run(run(args.calls))
    print(
        f"CPU per FCALL: redis-py {result['redis_py_us']} µs, channel {result['channel_us']} µs, "
        f"channel with {GROUP} at once {result['channel_concurrent_us']} µs",
        file=sys.stderr,
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
