"""The handler stage's view of offloaded payloads: a reference in, the event a handler expects out.

A message without ``pl-offload`` is decoded as always. For a reference, on a lane whose
``offload.store`` is the reference's store:

- a ``bytes`` (or :class:`~pipeline.offload.lazy.LazyPayload`) handler gets a
  :class:`~pipeline.offload.lazy.LazyPayload`: nothing is read until it reads (a HEAD first,
  so a missing object is a ``payload_missing`` dead letter before the handler runs);
- a typed handler (a pydantic model, ``dict``: a JSON object, ``str``: UTF-8 text), a
  ``Message`` handler, a debounced or a CPU-bound lane gets the event decoded from the body as
  a small one is (``Lane.decode``), fetched (digest checked) just before decoding. A
  debounced lane buffers the reference in Redis; its turn fetches the bodies again when it runs
  (``runtime/turns.py``).

A reference this member cannot resolve (its lane has no ``offload`` store, another store, an
unknown reference format) raises :class:`~pipeline.offload.errors.ReferenceRefused`: the message
goes to a retry tier with that reason, never to the handler. Retries, parking, dead letters and
redrive copy the message's value and headers, so they move the reference, never the body; the
producer they use (:func:`pipeline.offload.writer.offloading`, as the member builds it) first
writes an object last written a day ago or more again, so the purge cannot delete it while the
copy lives.
"""

from __future__ import annotations

import asyncio
import dataclasses
import types
import typing
from collections.abc import Sequence
from typing import Any

from pipeline.envelope import Message
from pipeline.offload import reference as ref
from pipeline.offload.errors import PayloadMissing, ReferenceRefused
from pipeline.offload.lazy import LazyPayload
from pipeline.offload.observer import OffloadObserver
from pipeline.offload.store import PayloadStore, open_store
from pipeline.runtime.app import Lane

FETCHING_AT_ONCE = 2
"""Chunks a member fetches and hashes at once: at 8, a 5 MiB payload per handler stalled the
loop 32 ms (p99) against 8 ms at 2, for the same throughput (``bench/offload.py``)."""


def _takes_lazy(lane: Lane) -> bool:
    """Whether ``lane``'s handler takes the raw payload one event at a time, in this process."""
    if lane.turns or lane.cpu_ref is not None:
        return False
    kind = lane.event  # resolved at registration (the event's annotation alone)
    union = typing.get_origin(kind) in (typing.Union, types.UnionType)
    options = typing.get_args(kind) if union else (kind,)
    return any(option in (bytes, LazyPayload) for option in options)


class Payloads:
    """Turns each message into its handler's event, resolving references; one per member."""

    def __init__(self, lanes: Sequence[Lane], observer: OffloadObserver | None = None) -> None:
        """Serve ``lanes`` (stores are opened on their first reference).

        ``observer`` (the member's metrics) is told of every payload read and missing object.
        """
        self._lazy = {lane.name: _takes_lazy(lane) for lane in lanes}
        self._observer = observer
        self._stores: dict[str, PayloadStore] = {}
        self._gate = asyncio.Semaphore(FETCHING_AT_ONCE)

    async def event(self, lane: Lane, message: Message) -> Any:
        """The event ``lane``'s handler gets for ``message``.

        Raises:
            ReferenceRefused: a reference this member cannot resolve (goes to a retry tier).
            PayloadMissing: the referenced object is gone (dead letter ``payload_missing``).
            PayloadCorrupt: it differs from the reference (dead letter ``payload_corrupt``).
            OffloadError: the store failed (retried).
        """
        if not ref.is_reference(message.headers):
            return lane.decode(message)
        policy = lane.spec.offload
        if policy is None:
            raise ReferenceRefused(
                f"lane {lane.name} has no offload store configured, so this member cannot read "
                "the payload reference: declare the lane's offload: in topics/"
            )
        reference = ref.decode(message.value, message.headers)
        if reference.store != policy.store:
            raise ReferenceRefused(
                f"the payload reference points to store {reference.store}, lane {lane.name} "
                f"reads {policy.store}"
            )
        store = self._store(policy.store)
        payload = LazyPayload(reference, store, self._gate, self._observer)
        if self._lazy.get(lane.name, False):
            async with self._gate:
                found = await store.head(reference.key)
            if found is None:
                if self._observer is not None:
                    self._observer.missing(store.url)
                raise PayloadMissing(
                    f"offloaded payload {reference.store}/{reference.key} does not exist"
                )
            return payload
        body = await payload.read()
        return lane.decode(dataclasses.replace(message, value=body))

    def _store(self, url: str) -> PayloadStore:
        store = self._stores.get(url)
        if store is None:
            store = self._stores[url] = open_store(url)
        return store
