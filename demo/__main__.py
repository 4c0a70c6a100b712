"""``python -m demo``: the command ``make demo`` runs (see :mod:`demo.run`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from redis.exceptions import RedisError

from demo.procs import ProcessFailed
from demo.run import Demo, DemoOptions
from pipeline.errors import PipelineError
from pipeline.topics.spec import parse_duration_ms


def _seconds(value: str) -> float:
    try:
        return parse_duration_ms(value) / 1000
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 20s or 3m, got {value!r}"
        ) from None


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the demo, return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    parser.add_argument("--transport", choices=["redis", "kafka"], default="redis")
    parser.add_argument("--duration", type=_seconds, default=180.0, help="traffic time (3m)")
    parser.add_argument("--headless", action="store_true", help="no live dashboard")
    parser.add_argument("--output", type=Path, default=Path("demo-output"))
    parser.add_argument("--prefix", help="Redis key prefix (default: a fresh one per run)")
    parser.add_argument("--keep-keys", action="store_true", help="keep the run's Redis keys")
    parser.add_argument("--drain-timeout", type=_seconds, default=60.0, help="drain wait (60s)")
    args = parser.parse_args(argv)
    options = DemoOptions(
        transport=args.transport,
        duration_s=args.duration,
        output=args.output,
        root=Path.cwd(),
        headless=args.headless,
        prefix=args.prefix,
        keep_keys=args.keep_keys,
        drain_timeout_s=args.drain_timeout,
    )
    try:
        summary = asyncio.run(Demo(options).run())
    except (ProcessFailed, PipelineError, RedisError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201
        return 1
    return 130 if summary["interrupted"] else 0


if __name__ == "__main__":
    sys.exit(main())
