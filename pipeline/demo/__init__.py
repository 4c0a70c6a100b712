"""The demo main job: the whole pipeline under a compressed noisy-neighbour hour.

``make demo`` (``python -m pipeline.demo``) starts the ingress, the schema registry, the example
consumer groups of ``consumers/``, the sweeper and a traffic generator as process groups, shows a
live dashboard of per-tenant waits, and ends with a summary (``demo-output/summary.json``) and
plots. Modules, in the order the data flows:

* :mod:`~pipeline.demo.traffic`: signed webhooks from 50 steady tenants and one flooder
  (posted with the small keep-alive client of :mod:`~pipeline.demo.poster`).
* :mod:`~pipeline.demo.observe`: wraps the example handlers to record one observation per call.
* :mod:`~pipeline.demo.stats`: folds observations into per-tenant waits and counts.
* :mod:`~pipeline.demo.watch`: log rows, topic counts and lag while it runs;
  :mod:`~pipeline.demo.audit`: where every unfinished event is, at the end.
* :mod:`~pipeline.demo.dashboard`, :mod:`~pipeline.demo.summary`, :mod:`~pipeline.demo.plots`.
* :mod:`~pipeline.demo.procs` and :mod:`~pipeline.demo.run`: the processes and the orchestrator.
"""
