"""A node's background work: the projection loop, the ledger sequencer, the
recovery Runtime and the webhook deliverer (docs/architecture.md: Processes).

``work`` starts them (threads of one process, each leading by the leadership
it always had, so two nodes still have one leader per role); ``process`` is
``kandev-es background``, the process of its own they run in; ``supervisor``
is what `kandev-es serve` and http/gunicorn.conf.py run in the gunicorn master
to start that process beside the web workers and start it again if it dies.
"""
