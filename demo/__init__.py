"""The demo main job: the whole pipeline under a compressed noisy-neighbour hour.

``make demo`` (``python -m demo``) starts the ingress, the schema registry, the example
consumer groups of ``consumers/``, the sweeper and a traffic generator as process groups, shows a
live dashboard of per-tenant waits, and ends with a summary (``demo-output/summary.json``) and
plots. It lives beside the package, outside the wheel: it runs from a checkout, where the
example consumers and its ``sources.yaml`` are. Modules, in the order the data flows:

* :mod:`~demo.traffic`: signed webhooks from 50 steady tenants and one flooder
  (posted with the small keep-alive client of :mod:`~demo.poster`).
* :mod:`~demo.observe`: wraps the example handlers to record one observation per call.
* :mod:`~demo.stats`: folds observations into per-tenant waits and counts.
* :mod:`~demo.watch`: log rows, topic counts and lag while it runs;
  :mod:`~demo.audit`: where every unfinished event is, at the end.
* :mod:`~demo.dashboard`, :mod:`~demo.summary`, :mod:`~demo.plots`.
* :mod:`~demo.procs` and :mod:`~demo.run`: the processes and the orchestrator.
"""
