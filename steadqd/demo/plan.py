"""The demo's plan: which job is what kind, which waits, and what each carries.

The producer enqueues by it, the job command (``steadqd.demo.job``) settles by
the kind in the payload, and the result check counts by it: one place for the
rule, so the three always agree.
"""

from __future__ import annotations

import json
from collections import Counter

DELAY_SECONDS = 2.0


def job_kind(i: int) -> str:
    """Kind of the i-th demo job: every 37th (from 7) is poison, every 11th (from 3) flaky.

    The two residue classes never meet below 407 jobs, so the counts are easy
    to check: ``plain + flaky`` jobs end acknowledged, ``poison`` ones buried.
    """
    if i % 37 == 7:
        return "poison"
    if i % 11 == 3:
        return "flaky"
    return "plain"


def job_delay(i: int) -> float:
    """Every 50th job (from 25) waits in delayed/ for DELAY_SECONDS before it may run."""
    return DELAY_SECONDS if i % 50 == 25 else 0.0


def plan_counts(jobs: int) -> Counter[str]:
    """How many jobs of each kind (and how many delayed) a run of ``jobs`` enqueues."""
    c: Counter[str] = Counter(job_kind(i) for i in range(jobs))
    c["delayed"] = sum(1 for i in range(jobs) if job_delay(i))
    return c


def payload(i: int) -> bytes:
    return json.dumps({"frame": i, "kind": job_kind(i)}, sort_keys=True).encode()
