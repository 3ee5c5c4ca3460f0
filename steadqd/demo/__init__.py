"""``steadqd demo``: the real daemons on a throwaway queue, fed by a separate producer.

``run`` drives the demo and checks its own result; ``job`` is the worker
command it configures (``python -m steadqd.demo.job``), whose exit status is
scripted by the payload so every path of the exit policy is exercised.
"""
