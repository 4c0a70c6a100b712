"""The ``pipeline`` command line, and what only the command line needs.

:mod:`pipeline.cli.commands` registers every command (the stages add theirs: ``ingress``,
``registry``, ``throttle``, ``capacity``); :mod:`pipeline.cli.status` and its view and probes
(:mod:`pipeline.cli.status_view`, :mod:`pipeline.cli.status_checks`) are ``pipeline status``;
:mod:`pipeline.cli.cancel` is ``pipeline cancel`` and :mod:`pipeline.cli.offload` is
``pipeline offload purge`` (here, as their stages' packages import redis-py and pydantic).
A command imports what it runs on when it runs: registering the commands loads no settings, no
client and no stage, so ``pipeline --help`` and each command start quickly.
"""

from pipeline.cli.commands import app, main

__all__ = ["app", "main"]
