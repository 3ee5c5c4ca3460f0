"""The bucket recovery pass (recovery.md): sweeps, retention GC and the repair scan, under one work budget.

A bucket queue stays live only if somebody runs this pass, as with the
filesystem's ``steadqd.fs.recovery``: expired leases become claimable
again, due delayed jobs are found, settled job graphs, orphan payloads and
old clock beacons are collected, and lost index entries are regenerated.
One module per question: ``sweep`` (the lease and delayed sweeps, the pass's
``Budget``), ``gc`` (retention GC; ``delete_job_graph`` is the one per-job
deletion), ``repair`` (the repair scan and its cursor, which ``fsck`` also
runs whole), ``driver`` (``run_recovery``: the phases and how they share the
budget).
"""
