"""Stage 6, admission: per-tenant fair throttles and the coalescing debouncer, held in Redis.

``throttle`` (fair waiter queues, multi-key acquisition, leases; typed wrappers around
``lua/throttle.lua`` in ``functions``), ``limits`` (dynamic limits), ``reserve`` (the slots kept
for tenants under their floor, sized from their rates) and the ``debounce`` package (one turn
per conversation burst, with its own Lua library).
"""
