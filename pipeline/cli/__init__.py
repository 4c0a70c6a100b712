"""The ``pipeline`` command line, and what only the command line needs.

:mod:`pipeline.cli.commands` registers every command (the stages add theirs: ``ingress``,
``registry``, ``throttle``, ``capacity``); :mod:`pipeline.cli.status` and its view and probes
(:mod:`pipeline.cli.status_view`, :mod:`pipeline.cli.status_checks`) are ``pipeline status``.
"""

from pipeline.cli.commands import app, main

__all__ = ["app", "main"]
