"""The crash lab: evidence that a job whose enqueue returned is never lost or duplicated, whatever the power does.

Every lane drives the real library and daemons into crashes and checks the
recovered tree against the same gates (:mod:`tests.lab.gates`). Lane 1 computes
crash states from recorded syscall traces under a persistence model
(:mod:`tests.lab.recorder`, :mod:`tests.lab.model`, :mod:`tests.lab.workloads`);
lane 2 replays the same workloads, and power cuts under ``steadqd run``, on a
journaling FUSE file system with its own model (:mod:`tests.lab.lazyfs`,
:mod:`tests.lab.lazystates`, :mod:`tests.lab.oracle`, :mod:`tests.lab.powercut`);
lanes 3 and 5 SIGKILL the deployed processes on real ext4/XFS/btrfs, briefly and
for hours (:mod:`tests.lab.killrig`); lane 4 injects storage faults.
:mod:`tests.lab.bugs` holds the deliberately broken protocols that show each
lane can fail. The pytest tests live in tests/crash; the command line is
``python -m tests.lab run|oracle|powercut`` and ``python -m tests.lab.killrig``
(docs/crash-lab.md).
"""
