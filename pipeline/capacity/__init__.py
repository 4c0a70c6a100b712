"""Capacity: arrival history per lane, a seasonal forecast, and members sized by Little's law.

history (Redis, per-minute counters) → forecast (same minutes of past weeks, times the trend)
→ plan (desired members, M/M/c wait) → the ``/metrics`` gauges KEDA scales on, and
``pipeline capacity LANE``. The scaling simulation (``bench/scaling.py``) compares policies.
"""
