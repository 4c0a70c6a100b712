"""``pipeline capacity LANE [--members N] [--json]``: how big the lane is, and should be.

Prints the lane's arrival rate (last five minutes) and forecast peak, its service time and
where it came from, the slots of ``--members`` members (default: the desired count), their
utilisation and the M/M/c expected wait at that utilisation, the lane's partitions (the most
members that consume it, the ScaledObject's ``maxReplicaCount``), and the members needed for
the target utilisation and for the target wait (``PIPELINE_CAPACITY__*``), saying so when they
are more than the partitions, which must then be added first. Redis unreachable, a
capacity key of another type (Redis answering ``WRONGTYPE``) or an unknown lane: one line on
stderr, exit 1, 1 or 2.

Redis, the settings and the declarations are imported when the command runs, not when
``pipeline`` registers it.
"""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from pipeline.cli_support import err, run_command
from pipeline.errors import ConfigError

if TYPE_CHECKING:
    from pipeline.capacity.plan import LanePlan

__all__ = ["as_dict", "capacity_command", "render"]


def as_dict(plan: LanePlan, partitions: int | None = None) -> dict[str, Any]:
    """The plan as plain JSON values (an unbounded wait or utilisation is ``null``).

    ``partitions``: the lane's partitions, when known (``null`` otherwise).
    """
    wait = plan.expected_wait_s
    busy = plan.utilisation
    return {
        "lane": plan.lane,
        "arrivals_per_s": round(plan.rate_per_s, 3),
        "forecast_peak_per_s": round(plan.forecast.peak_per_s, 3),
        "forecast_trend": round(plan.forecast.trend, 3),
        "planned_per_s": round(plan.planned_per_s, 3),
        "season": plan.season,
        "service_s": round(plan.service_s, 4),
        "service_source": plan.service_source,
        "members": plan.members,
        "slots": plan.slots,
        "utilisation": None if math.isinf(busy) else round(busy, 3),
        "expected_wait_s": None if math.isinf(wait) else round(wait, 4),
        "desired_members": plan.desired_members,
        "target_utilisation": plan.target_utilisation,
        "members_for_target_wait": plan.target_wait_members,
        "target_wait_s": plan.target_wait_s,
        "partitions": partitions,
    }


def render(plan: LanePlan, partitions: int | None = None) -> str:
    """The plan as the lines ``pipeline capacity`` prints (``partitions``: the lane's, if known).

    Members beyond the partitions sit idle, so a plan asking for more says to add partitions.
    """
    wait = plan.expected_wait_s
    shown_wait = "unbounded (arrivals exceed the slots)" if math.isinf(wait) else f"{wait:.3f} s"
    busy = plan.utilisation
    shown_busy = "unbounded (arrivals on no slots)" if math.isinf(busy) else f"{busy:.1%}"
    seasons = f"{plan.forecast.seasons} past {plan.season}s" if plan.forecast.seasons else "none"
    needed = max(plan.desired_members, plan.target_wait_members)
    short = ""
    if partitions is not None and needed > partitions:
        short = (
            f": more than the lane's {partitions} partitions, add partitions "
            "(topics/*.yaml, pipeline topics apply) first"
        )
    lines = (
        [
            f"lane {plan.lane}",
            (
                f"  arrivals        {plan.rate_per_s:.2f}/s now, forecast peak "
                f"{plan.forecast.peak_per_s:.2f}/s (seasons: {seasons}, "
                f"trend x{plan.forecast.trend:.2f}), sized for {plan.planned_per_s:.2f}/s"
            ),
            f"  service time    {plan.service_s:.3f} s ({plan.service_source})",
            f"  slots           {plan.slots} ({plan.members} x {plan.slots_per_member} per member)",
            f"  utilisation     {shown_busy}",
            f"  expected wait   {shown_wait} (M/M/c)",
        ]
        + (
            []
            if partitions is None
            else [f"  partitions      {partitions} (at most {partitions} members consume)"]
        )
        + [
            (
                f"  members needed  {plan.desired_members} at {plan.target_utilisation:.0%} "
                f"utilisation, {plan.target_wait_members} for a {plan.target_wait_s:g} s mean "
                f"wait{short}"
            ),
        ]
    )
    return "\n".join(lines)


def capacity_command(
    lane: Annotated[str, typer.Argument(help="A lane of topics/*.yaml.")],
    members: Annotated[
        int | None, typer.Option("--members", "-m", min=1, help="Members to evaluate.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Size a lane: arrivals, service time, slots, utilisation, expected wait, members needed."""
    from redis import exceptions as rexc  # noqa: PLC0415 - see the module doc
    from redis.asyncio import Redis  # noqa: PLC0415

    from pipeline.capacity.history import ArrivalHistory  # noqa: PLC0415
    from pipeline.capacity.plan import plan_lane  # noqa: PLC0415
    from pipeline.capacity.settings import check_service_lanes  # noqa: PLC0415
    from pipeline.config import load_settings  # noqa: PLC0415
    from pipeline.reachability import unreachable  # noqa: PLC0415
    from pipeline.topics.spec import load_specs  # noqa: PLC0415

    async def main() -> tuple[LanePlan, int]:
        # In the runner: a missing or invalid declaration is exit 2, as for every command.
        settings = load_settings()
        specs = load_specs(settings.topics_dir, settings.max_message_bytes)
        lanes = {spec.lane for spec in specs}
        if lane not in lanes:
            raise ConfigError(
                f"unknown lane {lane!r} in {settings.topics_dir} "
                f"(lanes: {', '.join(sorted(lanes))})"
            )
        check_service_lanes(settings.capacity, lanes, settings.topics_dir)
        slots = settings.capacity.slots_per_member or settings.runtime.max_concurrency
        client = Redis.from_url(settings.redis.url, socket_timeout=settings.redis.socket_timeout_s)
        history = ArrivalHistory(
            client, settings.redis.key_prefix, retention_days=settings.capacity.retention_days
        )
        # The most members that consume the lane: scripts/manifests.py's maxReplicaCount.
        partitions = max(spec.partitions for spec in specs if spec.lane == lane)
        try:
            plan = await plan_lane(
                history,
                lane,
                settings.capacity,
                slots_per_member=slots,
                now_s=time.time(),
                members=members,
            )
        except rexc.ResponseError as exc:  # Redis answered: reachable, but the keys are not ours
            keys = f"{{{settings.redis.key_prefix}:cap:{lane}}}*"
            err.print(
                f"[red]error:[/red] Redis refused reading lane {escape(repr(lane))}'s capacity "
                f"keys {escape(keys)}: {escape(str(exc))}; a key there was written by something "
                "else: remove it, or give this fleet another PIPELINE_REDIS__KEY_PREFIX",
                highlight=False,
            )
            raise typer.Exit(1) from None
        except (rexc.RedisError, OSError) as exc:
            line = unreachable(settings, "redis", str(exc))
            err.print(f"[red]error:[/red] {escape(str(line))}", highlight=False)
            raise typer.Exit(1) from None
        finally:
            await client.aclose()
        return plan, partitions

    plan, partitions = run_command(main())
    typer.echo(json.dumps(as_dict(plan, partitions)) if as_json else render(plan, partitions))
