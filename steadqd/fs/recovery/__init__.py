"""The recovery pass (recovery.md): a bounded, restartable maintenance sweep.

Liveness of a SteadQ/1 queue depends on somebody running this pass: expired
leases go back to ``ready/`` (or to ``dead/`` once their attempts are used
up), due delayed jobs are promoted, abandoned temp files disappear, full
receipts are compacted to 128-byte records and receipts past retention are
deleted. A backlog can be any size, and the pass runs inside callers that
must stay responsive (the sweeper's service loop, ``steadq recover``), so
each pass is bounded by a work budget (operations and milliseconds); and it
is resumable because that budget, a crash or a kill can stop it anywhere:
every step is a single rename or unlink followed by its barrier, so the pass
is safe to interrupt after any syscall, and the cursor
(``control/recovery-cursor.json``) names the phase the next pass starts with.
Recovery never poisons the handle and never raises for on-disk problems: each
one is recorded in the :class:`RecoveryReport` and the pass goes on with the
next entry. One module per phase, in cursor order: ``reap``, ``promote``,
``temp``, ``compact``, ``retention``; ``driver`` runs them; ``state``,
``walk``, ``objects`` and ``cursor`` are what they share.
"""

from steadqd.fs.recovery.driver import run_recovery
from steadqd.fs.recovery.state import PHASES, RecoveryReport

__all__ = ["PHASES", "RecoveryReport", "run_recovery"]
