"""Beside the flow: Prometheus metrics, the cached ``/metrics`` endpoint and status reports."""
