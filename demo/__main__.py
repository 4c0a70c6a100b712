"""``python -m demo``: the command ``make demo`` runs (see :mod:`demo.run`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

from redis.exceptions import RedisError

from demo.procs import ProcessFailed
from demo.run import Demo, DemoOptions
from demo.summary import lost_line
from pipeline.errors import PipelineError
from pipeline.topics.spec import parse_duration_ms


def _seconds(value: str) -> float:
    try:
        return parse_duration_ms(value) / 1000
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 20s or 3m, got {value!r}"
        ) from None


DESCRIPTION = """\
Run the whole pipeline under a compressed noisy-neighbour hour: the ingress, the
schema registry, the example consumer groups, the sweeper and a traffic generator
(50 steady tenants and one flooder). Shows a live dashboard of per-tenant waits
(or a progress line every 5 s with --headless or when not on a terminal), then
writes a summary and plots to the output directory. Ctrl-C stops every process.

Needs the local services (make services). See docs/demo.md.
"""
"""What ``--help`` says: plain text, since argparse prints the module's reST markup as is."""


def parser() -> argparse.ArgumentParser:
    """The demo's options."""
    parser = argparse.ArgumentParser(
        prog="python -m demo",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--transport", choices=["redis", "kafka"], default="redis", help="(default: redis)"
    )
    parser.add_argument("--duration", type=_seconds, default=180.0, help="traffic time (3m)")
    parser.add_argument("--headless", action="store_true", help="no live dashboard")
    parser.add_argument(
        "--output", type=Path, default=Path("demo-output"), help="(default: demo-output)"
    )
    parser.add_argument("--prefix", help="Redis key prefix (default: a fresh one per run)")
    parser.add_argument("--keep-keys", action="store_true", help="keep the run's Redis keys")
    parser.add_argument("--drain-timeout", type=_seconds, default=60.0, help="drain wait (60s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the demo, return the exit status."""
    args = parser().parse_args(argv)
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
    _trace_links(options.root)
    if summary["interrupted"]:
        return 130
    if (line := lost_line(summary, options.output.resolve())) is not None:
        print(line, file=sys.stderr)  # noqa: T201
        return 1
    return 0


def _trace_links(root: Path) -> None:
    """With traces sent to a local Jaeger, print a link to a flooder's and a small tenant's.

    Printed here rather than by ``deploy/local/demo.sh``, so that the script can hand its shell
    over to the demo and a SIGINT sent to it reaches the demo.
    """
    script = root / "deploy" / "local" / "jaeger.sh"
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") and script.exists():
        subprocess.run(["bash", str(script), "links"], check=False)  # noqa: S603, S607


if __name__ == "__main__":
    sys.exit(main())
