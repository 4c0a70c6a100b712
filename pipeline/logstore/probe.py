"""The row both log stores' ``probe_write`` inserts and deletes again in one transaction.

Its id and event id, :data:`PROBE_ID`, are no real row's (``~`` is in no id the ingress makes),
so the delete that follows the insert touches nothing else.
"""

from __future__ import annotations

__all__ = ["PROBE_ID", "probe_row"]

PROBE_ID = "~write-probe"
"""The id and event id of the probe row."""


def probe_row(body: bytes) -> tuple[object, ...]:
    """The probe row in the stores' insert order, its body ``body``."""
    return (PROBE_ID, "~", "~", "~", "~", "~", PROBE_ID, 0, "{}", body)
