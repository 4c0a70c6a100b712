"""Every Redis key the debouncer touches, in one place; ``lua/debounce.lua`` says what each holds.

All keys of a lane share the hash tag ``{PREFIX:deb:LANE}``:

- ``{PREFIX:deb:LANE}:due``: the lane's sorted set of due times, one member per conversation
  key with buffered messages;
- ``{PREFIX:deb:LANE}:b:KEY``: the conversation's buffer of messages;
- ``{PREFIX:deb:LANE}:s:KEY``: the conversation's state (marker, lease, attempts);
- ``{PREFIX:deb:LANE}:armed``: the due time some runner holds a timer for;
- ``{PREFIX:deb:LANE}:wake``: the list runners block on (BLPOP) to learn of earlier due times;
- ``{PREFIX:deb:LANE}:step:RUNNER``: a runner's last step and its reply (see :func:`step_key`);
- ``{PREFIX:deb:LANE}:e:EVENT``: where a buffered event waits (see :func:`event_key`);
- ``{PREFIX:deb:LANE}:l:KEY``: the locators of a conversation's buffered events (see
  :func:`locators_key`);
- ``{PREFIX:deb:LANE}:slot_guard``: never written (see :func:`slot_guard`).

Cluster trade-off: one function call must stay in one Redis Cluster slot. ``record`` and
``finish`` touch a conversation's keys *and* the lane's sorted set, and one ``claim`` leases many
conversations at once, so a per-(lane, key) tag would put those keys in other slots than the
sorted set. The tag is therefore per lane: every call is single-slot and atomic, and a lane's
debounce state lives on one cluster shard (one primary carries a lane; a lane that outgrows it
is split into several lanes). Conversation keys may hold any characters, braces included: only
the first ``{...}`` of a name is its hash tag.
"""

from __future__ import annotations


def lane_tag(prefix: str, lane: str) -> str:
    """The hash tag shared by every debounce key of ``lane``."""
    return f"{{{prefix}:deb:{lane}}}"


def key_prefix(prefix: str, lane: str) -> str:
    """The start of the lane's per-conversation key names (the Lua appends ``b:KEY``/``s:KEY``)."""
    return f"{lane_tag(prefix, lane)}:"


def due_key(prefix: str, lane: str) -> str:
    """The lane's sorted set of due times (member: conversation key, score: due time in ms)."""
    return f"{lane_tag(prefix, lane)}:due"


def armed_key(prefix: str, lane: str) -> str:
    """The due time (ms) a runner holds a timer for; expires once that time is long past."""
    return f"{lane_tag(prefix, lane)}:armed"


def wake_key(prefix: str, lane: str) -> str:
    """The list of due times that wake a blocked runner (``BLPOP``), newest first."""
    return f"{lane_tag(prefix, lane)}:wake"


def slot_guard(prefix: str, lane: str) -> str:
    """Never written; declared by ``db_claim`` and ``db_step``, beside the lane's keys.

    They reach conversation keys they do not declare. A call whose declared keys are partly
    missing while their Redis Cluster slot migrates is refused (``TRYAGAIN``) before it runs;
    with the lane's keys alone declared, Redis ran it on the migrating node and stopped it at the
    first conversation already moved, after leasing the turns before it to no caller.
    """
    return f"{lane_tag(prefix, lane)}:slot_guard"


def step_key(prefix: str, lane: str, runner: str) -> str:
    """The last ``db_step`` of ``runner`` that finished or leased turns, with its reply.

    A step sent again with the same token (its reply lost) gets that reply instead of running
    again, which would leave the turns it leased to no one and find its finishes lost.
    """
    return f"{lane_tag(prefix, lane)}:step:{runner}"


def buffer_key(prefix: str, lane: str, key: str) -> str:
    """The list of a conversation's buffered messages, oldest first."""
    return f"{key_prefix(prefix, lane)}b:{key}"


def state_key(prefix: str, lane: str, key: str) -> str:
    """The hash with a conversation's marker, lease and attempt count."""
    return f"{key_prefix(prefix, lane)}s:{key}"


def event_key(prefix: str, lane: str, event: str) -> str:
    """Where the buffered message whose event id has the digest ``event`` waits.

    ``<arrival>@<element digest>@<conversation key>``, written by ``db_record`` and deleted when
    the message leaves the buffer (however long it waited: its expiry only bounds a locator no
    finish deleted), so that the ingress's sweeper can ask (``db_held``) whether a webhook's
    event still waits for its turn, and ``db_record`` drop a replayed copy of it, however many
    messages its conversation buffered since.
    """
    return f"{key_prefix(prefix, lane)}e:{event}"


def locators_key(prefix: str, lane: str, key: str) -> str:
    """The list of the locators written for a conversation's buffered events, in buffer order.

    ``<event>@<arrival>@<element digest>`` each; the finish that takes messages out of the
    buffer pops their entries and deletes their locators (:func:`event_key`).
    """
    return f"{key_prefix(prefix, lane)}l:{key}"


def conversation_keys(prefix: str, lane: str, key: str) -> list[str]:
    """The due set, buffer and state of one conversation, in the order the Lua expects."""
    return [due_key(prefix, lane), buffer_key(prefix, lane, key), state_key(prefix, lane, key)]


def lane_keys(prefix: str, lane: str) -> list[str]:
    """Every key of a lane that is not per conversation (for deleting a lane's state)."""
    return [due_key(prefix, lane), armed_key(prefix, lane), wake_key(prefix, lane)]
