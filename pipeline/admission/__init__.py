"""Stage 6, admission: per-tenant fair throttles and the coalescing debouncer, held in Redis.

``throttle`` (fair waiter queues, multi-key acquisition, leases), ``limits`` (dynamic limits)
and ``debounce`` (one turn per conversation burst); their Lua lives in ``lua/``.
"""
