"""Every Redis key the demo touches, in one place.

=============================  ======  ===================================================
key                            type    holds
=============================  ======  ===================================================
``{P:demo}:obs``               stream  one entry per handler call (:mod:`.observe`), bounded
                                       with ``XADD MAXLEN ~``
=============================  ======  ===================================================

``P`` is ``PIPELINE_REDIS__KEY_PREFIX``: the demo runs under its own prefix, so every key of a
run (transport streams, parking, idempotency and these) can be found with :func:`run_patterns`.
"""

from __future__ import annotations


def observations(prefix: str) -> str:
    """The stream of handler observations."""
    return f"{{{prefix}:demo}}:obs"


def run_patterns(prefix: str) -> list[str]:
    """``SCAN MATCH`` patterns covering every key written under ``prefix``."""
    return [f"{prefix}:*", f"{{{prefix}:*"]
