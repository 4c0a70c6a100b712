"""Retry tiers and dead letters: what happens to a message whose handler failed.

* :mod:`~pipeline.retry.policy`: which failures are retried, and how long a tier waits.
* :mod:`~pipeline.retry.budget`: the retry budget that cuts a retry storm short.
* :mod:`~pipeline.retry.router`: a failed message to its next retry tier or the dead letters.
* :mod:`~pipeline.retry.guard_store` and ``lua/guard.lua``: the run guard's state in Redis
  (start marks, poison counts, parked keys and their held followers).
* :mod:`~pipeline.retry.held`: how a held follower is stored (the whole message, encoded once).
* :mod:`~pipeline.retry.keys`: every Redis key the guard touches, and a message key's names.
* :mod:`~pipeline.retry.rename_long_keys`, :mod:`~pipeline.retry.rename_functions` and
  ``lua/rename.lua``: parked long keys kept under the name every running member finds.

The runtime runs the guard around each message (:mod:`pipeline.runtime.guard`).
"""
