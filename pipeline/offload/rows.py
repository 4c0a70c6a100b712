"""The ingress's hook: a log row whose body belongs in the store becomes a reference row.

Called after verification and before the row is inserted, so the object is durable before the
row, and the row before the 2xx. The row keeps the reference's headers among its kept headers
(``pl-offload*``), and :func:`pipeline.ingress.headers.event_headers` puts them on the event, so
the fast path, the sweeper and ``pipeline replay`` all produce the reference, never the body.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pipeline.logstore import NewRow
from pipeline.offload.reference import HEADERS
from pipeline.offload.writer import Offloader


async def offload_row(offloader: Offloader, row: NewRow, sha256: str | None = None) -> NewRow:
    """``row`` with its body in the store and a reference in its place (or ``row`` unchanged).

    ``sha256``: the body's digest (hex) if the ingress already computed it (see
    :meth:`~pipeline.offload.writer.Offloader.offload`).

    Raises:
        OffloadError: the store failed: the webhook must be refused (503), not accepted.
    """
    kept = {name: value for name, value in row.headers.items() if name not in HEADERS}
    kind = row.headers.get("content-type", "")
    out = await offloader.offload(row.topic, row.body, kind, sha256=sha256)
    if out is None:
        return row if len(kept) == len(row.headers) else dataclasses.replace(row, headers=kept)
    body, headers = out
    kept.update((name, value.decode()) for name, value in headers.items())
    return dataclasses.replace(row, body=body, headers=kept)


def reference_headers(row_headers: Mapping[str, str]) -> dict[str, bytes]:
    """The ``pl-offload*`` headers a stored row carries, as event headers (none for a payload)."""
    return {name: row_headers[name].encode() for name in HEADERS if name in row_headers}
