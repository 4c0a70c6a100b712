"""Every Redis key the throttle touches, in one place (``lua/throttle.lua`` derives the same names).

All keys of one namespace share the hash tag ``{PREFIX:thr:NAMESPACE}``, so acquiring a job's
org, sub-tenant and document keys together is one call on one Redis Cluster slot. The price is
that one namespace lives on one cluster node; a fleet that outgrows a node splits its throttles
into namespaces (for example one per region or per product line), each its own slot, since the
keys of one job never span two namespaces.

A throttle key or a conversation key comes from the message (its ``pl-tenant`` header, its key,
a field of its JSON event) and goes into key names after the namespace's or lane's hash tag, so
no character of it moves the tag. :func:`key_text` is the one form every such key is stored in:
one longer than :data:`~pipeline.redis_keys.NAME_PART_MAX_BYTES` bytes is named by its head and
its digest (:func:`~pipeline.redis_keys.headed`), so a producer's 1 MiB ``pl-tenant`` is no 1 MiB
key name, and ``pipeline status`` still finds the key by its template's fixed text (``org:``).
"""

from __future__ import annotations

import re

from pipeline.redis_keys import bounded, headed

_SURROGATE = re.compile("[\ud800-\udfff]")


def key_text(key: str) -> str:
    """``key`` as Redis stores it: lone surrogates as U+FFFD, and bounded in size.

    A JSON string may escape half of a surrogate pair alone, which has no UTF-8 form;
    the replacement is the one a message key or ``pl-tenant`` header that is no UTF-8 gets when
    it is read. A key longer than :data:`~pipeline.redis_keys.NAME_PART_MAX_BYTES` bytes becomes
    its first 64 characters and ``#sha256:<hex>`` of all of it
    (:func:`~pipeline.redis_keys.headed`), in Redis, in status and in log lines; one at most
    that long is returned as it is. ``key_text`` of its own result is that result.
    """
    return headed(key if key.isascii() else _SURROGATE.sub("\ufffd", key))


def tag(prefix: str, namespace: str) -> str:
    """The hash tag shared by every key of ``namespace``."""
    return f"{{{prefix}:thr:{namespace}}}"


def meta(prefix: str, namespace: str) -> str:
    """The namespace's anchor hash (``seq``); ``KEYS[1]`` of every throttle function."""
    return f"{tag(prefix, namespace)}:meta"


def slot_guard(prefix: str, namespace: str) -> str:
    """Never written; ``KEYS[2]`` of every throttle function, beside ``meta``.

    A call whose declared keys are partly missing while their Redis Cluster slot migrates is
    refused (``TRYAGAIN``) before it runs. With ``meta`` alone declared, Redis ran the function
    on the migrating node and stopped it at the first key missing there, after its first writes.
    """
    return f"{tag(prefix, namespace)}:slot_guard"


def limits(prefix: str, namespace: str) -> str:
    """Hash: throttle key -> concurrency limit."""
    return f"{tag(prefix, namespace)}:limits"


def shares(prefix: str, namespace: str) -> str:
    """Hash: throttle key -> its :class:`~pipeline.admission.shares.Share` from the fleet."""
    return f"{tag(prefix, namespace)}:shares"


def fleet_factor(prefix: str, namespace: str) -> str:
    """String: the fleet's pressure factor now, which admission applies to each share.

    Set by the dynamic limits' tick (a TTL of a few ticks) in the namespace's hash tag, so
    ``thr_acquire`` reads it in the same call and on the same Redis Cluster slot.
    """
    return f"{tag(prefix, namespace)}:factor"


def reserve(prefix: str, namespace: str) -> str:
    """Throttle key -> ``"SLOTS:MIN_PRIO"``: slots of its limit kept for better priorities."""
    return f"{tag(prefix, namespace)}:reserve"


def reserved(prefix: str, namespace: str) -> str:
    """Hash: throttle key -> permits of its reserve's priorities that asked for it."""
    return f"{tag(prefix, namespace)}:reserved"


def reserved_queued(prefix: str, namespace: str) -> str:
    """Hash: throttle key -> permits of its reserve's priorities that queued on it."""
    return f"{tag(prefix, namespace)}:reserved_queued"


def leases(prefix: str, namespace: str) -> str:
    """Zset: holder -> lease expiry in ms, for every permit held or waiting."""
    return f"{tag(prefix, namespace)}:leases"


def active(prefix: str, namespace: str) -> str:
    """Set: throttle keys that have holders or waiters."""
    return f"{tag(prefix, namespace)}:active"


def permit(prefix: str, namespace: str, holder: str) -> str:
    """Hash: one permit's member, priority, lease, arrival sequence, keys and progress."""
    return f"{tag(prefix, namespace)}:p:{holder}"


def holders(prefix: str, namespace: str, key: str) -> str:
    """Zset: holders of ``key`` -> lease expiry in ms."""
    return f"{tag(prefix, namespace)}:h:{key}"


def waiters(prefix: str, namespace: str, key: str) -> str:
    """Zset: waiters of ``key`` -> rank ((1000 - priority) * 1e12 + arrival sequence)."""
    return f"{tag(prefix, namespace)}:w:{key}"


def grants(prefix: str, namespace: str, key: str) -> str:
    """List: the last 20 grants of ``key`` as ``"HOLDER NOW_MS"``, newest first.

    Deleted with the key's last holder or waiter (an hour's TTL besides).
    """
    return f"{tag(prefix, namespace)}:g:{key}"


def wake(prefix: str, namespace: str, member: str) -> str:
    """List: holders of ``member`` that a hand-over granted; the member ``BLPOP``s it."""
    return f"{tag(prefix, namespace)}:wake:{member}"


def aimd(prefix: str, namespace: str, key: str) -> str:
    """Hash: an adaptive key's AIMD state; ``set_limit`` deletes it (the window starts anew).

    ``limit`` is the window (a float), ``cut_ms`` its last decrease and ``until`` the time a
    Retry-After closed the key up to (ms).
    """
    return f"{tag(prefix, namespace)}:aimd:{key}"


def closed(prefix: str, namespace: str) -> str:
    """Zset: adaptive key -> when its Retry-After ends (ms); its limit is 0 until then.

    Every throttle call reopens those due, each with its window (:func:`aimd`) as its limit.
    """
    return f"{tag(prefix, namespace)}:closed"


def limit_stats(prefix: str, org: str) -> str:
    """Hash: an org's per-minute submission counts and duration sums (see ``limits.py``).

    The org is named as the seen window names it (:func:`org_name`: a ``pl-tenant`` over
    :data:`~pipeline.redis_keys.NAME_PART_MAX_BYTES` bytes by its head and digest); a member of
    an earlier release named such a tenant's stats by the digest of the tenant alone.
    """
    return f"{{{prefix}:lim:{bounded(org)}}}:stats"


def org_config(prefix: str) -> str:
    """Hash: org -> JSON of its :class:`~pipeline.admission.limits.OrgLimits` overrides."""
    return f"{{{prefix}:lim}}:orgs"


def fleet_load(prefix: str) -> str:
    """Hash: member -> JSON of its running handlers and slots, for the dynamic limits."""
    return f"{{{prefix}:lim}}:fleet"


def org_name(tenant: str) -> str:
    """The name the dynamic limits know ``tenant`` by: what follows ``org:`` in its throttle key.

    ``tenant`` itself while its key ``org:TENANT`` is at most
    :data:`~pipeline.redis_keys.NAME_PART_MAX_BYTES` bytes (and has no lone surrogate); a longer
    one is named as :func:`key_text` names that key (its head and the digest of the key), so a
    256 KiB ``pl-tenant`` is no 256 KiB member of :func:`orgs_seen`, and ``org:`` and the name
    are the very key its jobs are admitted under: the tick finds an org with work among the
    active keys by it. Its stats (:func:`limit_stats`) go by this name too.
    """
    return key_text(f"org:{tenant}")[4:]


def orgs_seen(prefix: str) -> str:
    """Zset: :func:`org_name` -> when a member last saw work of it (ms), for the dynamic limits."""
    return f"{{{prefix}:lim}}:seen"


def limits_cursor(prefix: str) -> str:
    """Hash: where the dynamic limits' capped tick stopped, for the next tick to go on.

    ``active``: the name of the last org with work reached; ``slice``: the time the last org
    of the seen set reached was seen, and its name.
    """
    return f"{{{prefix}:lim}}:cursor"


def limits_tick(prefix: str, tick: int) -> str:
    """String: who recomputes the dynamic limits of one tick (``SET NX``)."""
    return f"{{{prefix}:lim}}:tick:{tick}"
