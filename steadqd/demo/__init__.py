"""``steadqd demo``: the real daemons on a throwaway queue, fed by a separate producer.

``run`` drives the demo (``steadqd demo`` imports it only when the command
runs); the rest, each named by what it does: ``plan`` (which job is what
kind), ``queue_setup`` (the queue and its ``demo.yaml``), ``children`` (the
child processes and their output), ``producer`` (the separate producer
process), ``daemon_log`` (reading the daemon's log lines), ``check`` (the
result against the plan), ``bucket`` (``--s3``: the queue in the embedded
SeaweedFS that ``seaweed`` starts). ``job`` is the worker command it
configures (``python -m steadqd.demo.job``), whose exit status is scripted by
the payload so every path of the exit policy is exercised.
"""
