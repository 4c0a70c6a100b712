"""A serving ingress hands the C heap back once its requests stop (pipeline/heap.py).

``pipeline ingress serve`` counts what it answered (:attr:`IngressApp.counters`); once that
count has moved and then stood still, ``malloc_trim`` runs on a worker thread. The ingress here
is the real one (uvicorn, Redis Streams, SQLite log), served by
:func:`pipeline.ingress.service.serve`; its seams are the trim it is given (glibc's, counting
its calls and the answered count it saw) and the trimmer's timings (checks every 50 ms, no
least interval) so that the quiet comes within the test.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from ingress.helpers import built_with_topics, one_lane_ingress

from pipeline import heap
from pipeline.ingress import service
from pipeline.ingress.service import Ingress

REQUESTS = 20


class _SeenTrim:
    """glibc's malloc_trim, recording the ingress's answered count at each call."""

    def __init__(self, answered: Callable[[], int]) -> None:
        trim = heap.heap_trim()
        assert trim is not None, "this test needs glibc"
        self._trim = trim
        self._answered = answered
        self.seen: list[int] = []
        self.after_all = threading.Event()
        """Set by a trim that saw all the requests answered."""

    def __call__(self, pad: int, /) -> int:
        self.seen.append(self._answered())
        if self.seen[-1] == REQUESTS:
            self.after_all.set()
        return self._trim(pad)


async def _built(tmp_path: Path, unique: str) -> Ingress:
    """An ingress with one unsigned source on a lane of its own (its topics made, and dropped)."""
    topic = f"trim-{unique}"
    lane = {"name": topic, "partitions": 1, "lane": f"trim_{unique}"}
    sources = {"plain": {"scheme": "none", "topic": topic}}
    return await built_with_topics(*one_lane_ingress(tmp_path, lane, sources))


async def test_a_serving_ingress_trims_its_heap_once_its_requests_stop(
    tmp_path: Path, redis_service: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No trim before any request; one after the requests, seeing all of them; none left after.

    The trimmer ends with the serve: no task of it is left once ``serve`` has returned.
    """
    built = await _built(tmp_path, unique)
    trim = _SeenTrim(lambda: sum(built.app.counters.values()))
    monkeypatch.setattr(service, "heap_trim", lambda: trim)
    quick = functools.partial(heap.keep_trimmed, check_s=0.05, min_interval_s=0)
    monkeypatch.setattr(service, "keep_trimmed", quick)
    servers: list[Any] = []

    def kept_server(*args: Any, **kwargs: Any) -> Any:
        servers.append(service_http_server(*args, **kwargs))
        return servers[-1]

    service_http_server = service.http_server
    monkeypatch.setattr(service, "http_server", kept_server)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    listening = asyncio.Event()
    serving = asyncio.create_task(
        service.serve(built, "127.0.0.1", port, lambda _h, _p: listening.set(), sock=sock)
    )
    try:
        await asyncio.wait_for(listening.wait(), 60)
        assert trim.seen == []  # nothing answered yet: nothing freed to hand back
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            for n in range(REQUESTS):
                answer = await http.post("/hooks/plain", content=b'{"n": %d}' % n)
                assert answer.status_code == 200
        # checks every 50 ms: the quiet after the last request is seen at once
        assert await asyncio.to_thread(trim.after_all.wait, 30), trim.seen
        assert trim.seen[-1] == REQUESTS
    finally:
        if servers:
            servers[0].should_exit = True
        await asyncio.wait_for(serving, 60)
        sock.close()
    trimmers = [t for t in asyncio.all_tasks() if "keep_trimmed" in repr(t.get_coro())]
    assert trimmers == []
    assert trim.seen.count(REQUESTS) == 1  # quiet since: not trimmed again for nothing new
