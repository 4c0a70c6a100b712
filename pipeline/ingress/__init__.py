"""Stage 1, the webhook door: verify, cap, dedupe, route, commit, answer, then produce.

Per request, in this order (:mod:`pipeline.ingress.app`)::

    admission slot ─▶ read body (413) ─▶ verify (401) ─▶ extract + route (400)
        ─▶ insert into the log store, unique (source, event id) ─▶ durable commit
        ─▶ 200 ─▶ produce the keyed event asynchronously ─▶ mark the row produced

The sweeper (:mod:`pipeline.ingress.sweeper`) produces what the fast path lost and replays what
no consumer reported processed; ``pipeline replay`` (:mod:`pipeline.ingress.replay`) replays a
selection by hand.
"""
