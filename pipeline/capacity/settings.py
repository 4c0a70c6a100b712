"""Capacity planning settings (environment, ``PIPELINE_CAPACITY__*``).

``PIPELINE_CAPACITY__SERVICE_S='{"ai_turns": 4.0}'`` gives a lane's service time until one is
measured; ``PIPELINE_CAPACITY__TARGET_UTILISATION=0.7`` is the Little's-law headroom.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from pipeline.errors import ConfigError

__all__ = ["CapacitySettings", "check_service_lanes"]


class CapacitySettings(BaseModel):
    """Arrival history, the forecast and the desired member counts derived from it."""

    # An infinite lead, interval or service time is no plan (ceil(inf) raises): finite only.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    record: bool = False
    """Count produced events per lane in the arrival history and export the plan (the ingress;
    needs Redis). The Kubernetes config map turns it on."""
    flush_interval_s: float = Field(default=5.0, gt=0)
    """How often counted arrivals are written to Redis (one pipelined round trip)."""
    retention_days: int = Field(default=28, ge=1, le=366)
    """Days of per-minute arrival counts kept per lane (5,760 bytes a day)."""
    lead_s: float = Field(default=600.0, ge=60)
    """How far ahead the forecast looks: a member's start-up plus a scale-down window."""
    trend_min: int = Field(default=15, ge=5, le=1_440)
    """Minutes of recent arrivals compared with the seasonal baseline (the trend)."""
    target_utilisation: float = Field(default=0.7, gt=0, le=1)
    """Slot utilisation the desired member count plans for (headroom, seed 003: about 70 %)."""
    target_wait_s: float = Field(default=1.0, gt=0)
    """Mean wait for a slot the planner sizes for (`pipeline capacity`)."""
    min_members: int = Field(default=1, ge=0)
    """The floor of the desired member count."""
    slots_per_member: int | None = Field(default=None, ge=1)
    """Handler slots of one member; none: `RUNTIME__MAX_CONCURRENCY`."""
    default_service_s: float = Field(default=0.1, gt=0)
    """Service time assumed for a lane with no measurement and no entry in `SERVICE_S`."""
    service_s: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    """JSON object: lane to its service time in seconds, used until one is measured."""


def check_service_lanes(
    settings: CapacitySettings, lanes: Collection[str], topics_dir: Path
) -> None:
    """ConfigError when ``SERVICE_S`` names a lane none of ``lanes`` (those declared) is.

    Such an entry (a misspelt lane) would never be used: the lane it was meant for would be
    sized with ``DEFAULT_SERVICE_S`` without a word.
    """
    unknown = sorted(set(settings.service_s) - set(lanes))
    if unknown:
        raise ConfigError(
            f"PIPELINE_CAPACITY__SERVICE_S names {', '.join(map(repr, unknown))}, which no topic "
            f"of {topics_dir} declares as a lane (lanes: {', '.join(sorted(lanes))}); correct "
            "the name or remove the entry"
        )
