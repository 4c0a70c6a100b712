"""What every command does first: logging from the environment, then the open-file limit.

``pipeline``'s entry point (:func:`pipeline.cli.main`) and the stand-alone ones of the registry
(``python -m pipeline.registry``) and the ingress (``python -m pipeline.ingress.cli``) start
alike. :func:`start` configures logging from ``PIPELINE_LOG_LEVEL`` and ``PIPELINE_LOG_FORMAT``
(:mod:`pipeline.log_repeats`), then raises the soft open-file limit (:mod:`pipeline.descriptors`):
logging first, so a refused raise is a formatted line, from a long-running command only. A
variable with a value it cannot take is :class:`ConfigError`, before the limit is touched;
``pipeline`` prints it as its other errors, :func:`start_standalone` as one plain ``error:``
line: exit 2 from both, as for any other bad configuration.

The span exporter (:mod:`pipeline.tracing.export`) starts otherwise: its parent refused a bad
variable already, and it inherits the parent's limit.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pipeline.descriptors import raise_open_file_limit
from pipeline.errors import ConfigError
from pipeline.log_repeats import configure_logging, logging_from_environment

__all__ = ["start", "start_standalone"]


def start(argv: Sequence[str]) -> None:
    """Configure logging from the environment, then raise the open-file limit for ``argv``.

    ``argv`` is the command line less the program (``sys.argv[1:]``). Raises
    :class:`ConfigError` naming ``PIPELINE_LOG_LEVEL`` or ``PIPELINE_LOG_FORMAT`` for a value it
    cannot take.
    """
    configure_logging(*logging_from_environment())
    raise_open_file_limit(argv)


def start_standalone(argv: Sequence[str]) -> None:
    """:func:`start`, for a stand-alone entry: a bad log variable is one line and exit 2."""
    try:
        start(argv)
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(2)
