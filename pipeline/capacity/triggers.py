"""The PromQL of a lane's slot trigger: busy slots plus the members its backlog needs.

KEDA's ``prometheus`` trigger asks for ``ceil(value / threshold)`` members. A trigger on busy
slots alone cannot see a backlog: a saturated lane shows 100 % busy however long its queue, so
each round of new members adds only ``1 / target`` more, one start-up apart. The query built
here adds :func:`~pipeline.capacity.queueing.backlog_members`, in units of the threshold, so
KEDA asks for ``ceil(busy / threshold) + backlog_members(waiting)``:

- *waiting* is the group's lag (``pipeline_consumer_lag_messages``: produced, not committed)
  less the busy slots (``pipeline_worker_slots_busy``) and the messages held by the lane's
  per-tenant throttle (``pipeline_throttle_waiting``: a tenant's wait for its own slots is not
  a shortage of members) and the messages the members finished behind a lower offset not yet
  done (``pipeline_finished_uncommitted_messages``: behind a long run, the lag keeps them until
  it ends), the messages that wait for a slot;
- the service time is the lane's, as the capacity planner exports it
  (``pipeline_service_time_seconds``); with no planner running the backlog term is 0 and the
  trigger is the plain busy-slot one.

The scaling simulation's predictive policy (:class:`~pipeline.capacity.policies.PredictivePolicy`)
asks for the same count from the same function.
"""

from __future__ import annotations

__all__ = ["DRAIN_S", "busy_query", "slot_query"]

DRAIN_S = 300.0
"""Seconds a backlog is sized to drain in: about a member's start-up."""


def busy_query(pods: str) -> str:
    """The busy slots of ``pods`` (a regex): a batch lane's whole slot trigger."""
    return f'sum(pipeline_worker_slots_busy{{pod=~"{pods}"}})'


def slot_query(
    lane: str,
    group: str,
    pods: str,
    *,
    slots_per_member: int,
    threshold: int,
    drain_s: float = DRAIN_S,
) -> str:
    """The busy slots of ``pods`` (a regex) plus ``threshold`` per member the backlog needs."""
    busy = busy_query(pods)
    lag = f'max(pipeline_consumer_lag_messages{{lane="{lane}",group="{group}"}})'
    service = f'max(pipeline_service_time_seconds{{lane="{lane}"}})'
    throttled = f'(sum(pipeline_throttle_waiting{{lane="{lane}"}}) or vector(0))'
    finished_uncommitted = f'pipeline_finished_uncommitted_messages{{lane="{lane}",pod=~"{pods}"}}'
    finished = f"(sum({finished_uncommitted}) or vector(0))"
    waiting_beyond = f"clamp_min({lag} - {busy} - {throttled} - {finished} - {slots_per_member}, 0)"
    backlog = f"ceil({waiting_beyond} * {service} / {slots_per_member * drain_s:g})"
    return f"{busy} + {threshold} * ({backlog} or vector(0))"
