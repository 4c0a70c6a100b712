"""Beside the flow: Prometheus metrics and the cached ``/metrics`` endpoint the members serve."""
