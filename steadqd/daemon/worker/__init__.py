"""The worker role: one job from its claim to its settlement, one file per step, read in this order.

1. role.py: :class:`~steadqd.daemon.worker.role.WorkerRole`, the service loop's wiring: when to
   fill free slots, the wake-ups, STATUS=, reload, drain and close.
2. claim.py: the claiming thread (``Preparer``) claims jobs under one barrier and copies each
   payload (payload.py: the per-job copy directories) with a handle of its own.
3. run/: the job is started (``_Job``, child.py; ``steadq-exec`` in exec_helper.py/.c), its
   process groups are guarded (guard.py), and leasing holds while commands cannot start (hold.py).
4. renew.py: the one lease keeper, renewing the lease while the job is prepared and runs.
5. policy.py: the exit policy turns how the command ended into ack, retry or bury.
6. settle.py: the verdict is applied on the settling thread (group commit) and told in the journal.
"""
