"""The log store's error, a branch of the pipeline's tree (see :mod:`pipeline.errors`).

::

    PipelineError
    └── LogStoreError       the log database refused or failed an operation
"""

from __future__ import annotations

from pipeline.errors import PipelineError


class LogStoreError(PipelineError):
    """The log database failed an operation (unreachable, full, locked, corrupt)."""
