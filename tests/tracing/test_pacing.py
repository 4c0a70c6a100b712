"""The exporting process keeps batches while the traced process is busy, and never too long."""

from __future__ import annotations

import contextlib
import marshal
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from tracing.otlp_receiver import OtlpReceiver

from pipeline import tracing
from pipeline.envelope import Message
from pipeline.tracing.framing import HEADER, FrameReader, frame
from pipeline.tracing.pacing import BUSY_SHARE, Backlog, CpuWatch, cpu_seconds_of, paced

TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _records(body: bytes) -> list[object]:
    """A batch's records, as the exporting process reads them."""
    records: list[object] = marshal.loads(body)  # noqa: S302 - written by this test
    return records


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    """A pipe's read and write ends, both closed afterwards."""
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        with contextlib.suppress(OSError):
            os.close(fd)


def test_a_frame_is_read_back_whole_however_it_arrives(pipe: tuple[int, int]) -> None:
    """A batch split across writes comes out once complete; one cut short by the end never."""
    read_fd, write_fd = pipe
    first, second = frame([("s", 1, "a")]), frame([("s", 2, "b"), ("s", 3, None)])
    reader = FrameReader(read_fd)
    os.write(write_fd, first + second[:5])
    assert [_records(body) for body in reader.read(None) or []] == [[("s", 1, "a")]]
    assert reader.read(0) == []  # nothing new yet
    os.write(write_fd, second[5:] + HEADER.pack(100) + b"cut")
    assert [_records(body) for body in reader.read(None) or []] == [[("s", 2, "b"), ("s", 3, None)]]
    os.close(write_fd)
    assert reader.read(None) is None


def test_the_backlog_sends_when_idle_late_or_large() -> None:
    """Kept while busy; due when the process pauses, at the delay, or past the size bound."""
    backlog = Backlog(delay_s=5.0, max_bytes=10)
    assert not backlog.due(0.0, busy=False)  # nothing kept
    backlog.add(b"abcd", 1.0)
    assert not backlog.due(1.0, busy=True)
    assert backlog.due(1.0, busy=False)
    assert backlog.due(6.0, busy=True)  # waited the delay
    backlog.add(b"efghijk", 2.0)
    assert backlog.bytes == 11
    assert backlog.due(2.0, busy=True)  # past the bound
    assert backlog.pop() == b"abcd"
    assert backlog.bytes == 7
    assert not backlog.due(2.0, busy=True)
    assert len(backlog) == 1


def test_busy_is_a_share_of_one_core_over_a_window() -> None:
    """At least half a core over the window is busy; the verdict holds until the next window."""
    used = [0.0]
    watch = CpuWatch(lambda: used[0], window_s=0.25)
    assert not watch.busy(10.0)  # the first reading only starts a window
    used[0] = 0.25 * BUSY_SHARE
    assert not watch.busy(10.125)  # inside the window: the verdict stands
    assert watch.busy(10.25)  # half a core over the window
    used[0] += 0.0625
    assert watch.busy(10.375)
    assert not watch.busy(10.5)  # a quarter of a core
    unreadable = CpuWatch(lambda: None)
    assert not unreadable.busy(0.0)
    assert not unreadable.busy(1.0)


def test_a_process_cpu_time_is_read_from_proc() -> None:
    """The reading grows with the CPU time a process uses; a process that is gone reads None."""
    read = cpu_seconds_of(os.getpid())
    before = read()
    if before is None:
        pytest.skip("no /proc here")
    start = time.process_time()
    while time.process_time() - start < 0.05:
        sum(range(1_000))
    after = read()
    assert after is not None
    assert after >= before + 0.02  # 50 ms used, counted in 10 ms ticks
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert cpu_seconds_of(int(gone.stdout))() is None


def test_paced_keeps_batches_while_busy_and_sends_all_in_order_at_the_end(
    pipe: tuple[int, int],
) -> None:
    """Busy and within the delay: nothing leaves until the input ends, then all, oldest first."""
    read_fd, write_fd = pipe
    for number in range(3):
        os.write(write_fd, frame([("s", number)]))
    os.close(write_fd)
    reader = _EndNoting(FrameReader(read_fd))
    sent: list[tuple[bool, list[object]]] = []
    paced(
        reader,
        Backlog(3600.0),
        lambda _now: True,
        lambda body: sent.append((reader.ended, _records(body))),
    )
    assert sent == [(True, [("s", 0)]), (True, [("s", 1)]), (True, [("s", 2)])]


class _EndNoting:
    """A :class:`FrameReader` that notes when it has seen the end of its input."""

    def __init__(self, reader: FrameReader) -> None:
        self.reader = reader
        self.ended = False

    def read(self, timeout_s: float | None) -> list[bytes] | None:
        bodies = self.reader.read(timeout_s)
        self.ended = bodies is None
        return bodies


def test_paced_sends_each_batch_as_it_comes_when_idle(pipe: tuple[int, int]) -> None:
    """Not busy: every batch is sent before the next read, in order."""
    read_fd, write_fd = pipe
    for number in range(3):
        os.write(write_fd, frame([("s", number)]))
    os.close(write_fd)
    sent: list[list[object]] = []
    paced(
        FrameReader(read_fd),
        Backlog(3600.0),
        lambda _now: False,
        lambda body: sent.append(_records(body)),
    )
    assert sent == [[("s", 0)], [("s", 1)], [("s", 2)]]


class _Flood:
    """Input that always holds more: three batches of 10 bytes at every read, ``reads`` times."""

    def __init__(self, reads: int) -> None:
        self.left = reads

    def read(self, _timeout_s: float | None) -> list[bytes] | None:
        if not self.left:
            return None
        self.left -= 1
        return [b"x" * 10] * 3


def test_a_collector_slower_than_the_input_keeps_the_backlog_within_its_bound() -> None:
    """Past its size bound the backlog is sent before more is read, so the memory stays bounded.

    Sending one batch a read while three arrive (a collector that is down, each request waiting
    out its retries) kept everything that arrived: the exporting process grew without end. The
    rest waits in the pipe and then in the traced process's bounded queue.
    """
    backlog = Backlog(3600.0, max_bytes=100)
    peak = 0
    sent = 0

    def send(_body: bytes) -> None:
        nonlocal peak, sent
        peak = max(peak, backlog.bytes)
        sent += 1

    paced(_Flood(200), backlog, lambda _now: False, send)
    assert sent == 600  # nothing that was read is lost
    assert peak <= 100 + 30  # the bound, plus one read


def test_a_traced_process_that_never_pauses_still_gets_its_spans_out(
    traced: OtlpReceiver,
) -> None:
    """The exporting process sends kept spans at the schedule delay while the parent stays busy."""
    busy_from = time.process_time()
    while time.process_time() - busy_from < 0.5:  # busy before the batch arrives, and after
        sum(range(10_000))
    message = Message("t", 0, 1, b"k", b"v", {"traceparent": TRACEPARENT}, 1)
    delivery = tracing.process(message, "lane")
    assert delivery is not None
    tracing.finish(delivery, "handled")
    deadline = time.monotonic() + 30
    while not traced.spans and time.monotonic() < deadline:
        sum(range(10_000))  # busy: the exporting process keeps the batch until its delay
    assert {span.name for span in traced.spans} == {"partition wait", "process t"}
