"""Crash lab lane 5: the soak. 3 producers, ``steadqd run`` (concurrency 8), random SIGKILLs.

Why: the kill lane runs a fixed, small number of rounds; the soak keeps the
mix going for a configurable time so that rarer interleavings (a kill during
compaction, during a reap, while a producer's bucket directory is new) get
their chance. It ends with every enqueued job accounted for exactly once (one
receipt or one dead entry) in the final state its script, the exit policy and
the kills allow, nothing quarantined, no stray temps, fsck clean.

``STEADQ_SOAK_SECONDS`` sets the killing phase (default 20 s in CI);
``STEADQ_SOAK_FS`` the filesystem (default ext4). For hours use the lab
command ``python -m tests.lab.killrig soak --seconds 14400`` (docs/crash-lab.md).
"""

from __future__ import annotations

import os

import pytest

from tests.lab.killrig import soak
from tests.lab.lanereport import emit

SECONDS = float(os.environ.get("STEADQ_SOAK_SECONDS", "20"))
FS = os.environ.get("STEADQ_SOAK_FS", "ext4")
SEED = int(os.environ.get("STEADQ_CRASH_SEED", "8"))


def test_soak(request: pytest.FixtureRequest) -> None:
    rep = soak(FS, seconds=SECONDS, seed=SEED)
    emit(request, "lane 5 (soak)", rep.line())
    assert rep.committed > 0 and sum(rep.kills.values()) > 0, "the soak did nothing: it proves nothing"
    assert rep.receipts + rep.dead == rep.committed + rep.inflight_kept
