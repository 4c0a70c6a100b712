"""Handing finished records to the exporting process, from a thread of the traced process.

Like the SDK's batch span processor and with its variables: every ``OTEL_BSP_SCHEDULE_DELAY``
ms, or as soon as ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` records wait, the thread takes what the
:class:`~.record.Buffer` holds (at most ``OTEL_BSP_MAX_QUEUE_SIZE``; beyond, records are
dropped and counted) and writes it, marshalled and length-prefixed (:func:`.framing.frame`), to
the standard input of ``python -m pipeline.tracing.export``. Writing blocks only this thread,
never a stage.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import IO

from pipeline.tracing.export import (
    EXITING,
    MAX_EXPORT_BATCH,
    READY,
    SCHEDULE_DELAY_MS,
    bsp_setting,
)
from pipeline.tracing.framing import frame
from pipeline.tracing.record import Buffer, Record

log = logging.getLogger(__name__)


class Shipper:
    """The exporting process and the thread that feeds it."""

    def __init__(self, environ: Mapping[str, str], service: str) -> None:
        """Start the exporting process (it inherits the environment) and the thread."""
        self.delay_s = bsp_setting(environ, "OTEL_BSP_SCHEDULE_DELAY", SCHEDULE_DELAY_MS) / 1000
        self._wake = threading.Event()
        self.buffer = Buffer(
            bsp_setting(environ, "OTEL_BSP_MAX_QUEUE_SIZE", 2048),
            bsp_setting(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", MAX_EXPORT_BATCH),
            self._wake.set,
        )
        self._process = subprocess.Popen(  # noqa: S603 - this interpreter, our own module
            [sys.executable, "-m", "pipeline.tracing.export", service],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, **environ},
        )
        self._stopping = False
        assert self._process.stdout is not None  # noqa: S101 - opened with stdout=PIPE
        self._broken = self._process.stdout.read(len(READY)) != READY  # loaded, exporter made
        if self._broken:
            log.warning("tracing: the exporting process did not start; spans are not exported")
        self._thread = threading.Thread(target=self._run, name="pipeline-tracing", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.delay_s)
            self._wake.clear()
            self._send(self.buffer.take())

    def _send(self, records: list[Record]) -> None:
        if not records or self._broken:
            return
        stdin: IO[bytes] | None = self._process.stdin
        framed = frame(records)
        try:
            assert stdin is not None  # noqa: S101 - opened with stdin=PIPE
            stdin.write(framed)
            stdin.flush()
        except (OSError, ValueError):
            self._broken = True
            log.warning("tracing: the exporting process exited; spans are no longer exported")

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Hand over what is buffered, let the exporting process flush it, and wait for it.

        The exporting process is told first (:data:`.export.EXITING`): a collector that is
        down or does not answer then costs one more try, not every batch's retries.
        """
        if not self._broken and self._process.poll() is None:
            with contextlib.suppress(OSError):  # gone in between
                self._process.send_signal(EXITING)
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)
        self._send(self.buffer.take())
        if self._process.stdin is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()
        try:
            self._process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
            log.warning(
                "tracing: the exporting process was still sending %.0f s after the exit began; "
                "stopped, the spans it still held are dropped",
                timeout_s,
            )
        if self._process.stdout is not None:
            self._process.stdout.close()
        if self.buffer.dropped:
            log.warning(
                "tracing: %d records dropped (more than OTEL_BSP_MAX_QUEUE_SIZE waited)",
                self.buffer.dropped,
            )


def in_child_process() -> None:
    """After a fork: the child neither records nor ships (its parent's thread is not there)."""
    from pipeline.tracing import spans  # noqa: PLC0415 - imported by the time a fork happens

    spans.install(None)


os.register_at_fork(after_in_child=in_child_process)
