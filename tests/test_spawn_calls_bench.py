"""benchmarks.spawn_calls: the per-job Python calls of the worker's threads, from two drains.

Counts, never times: a small pair of drains must find each of the worker's three Python threads and
functions that run exactly once a job (the verdict's, the claim's) at one call a job.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import spawn_calls


def test_per_job_is_the_difference_over_the_jobs_between() -> None:
    lo = {"loop": {"f": 10, "g": 3}, "t": {"h": 1}}
    hi = {"loop": {"f": 50, "g": 3, "k": 20}, "t": {"h": 1}}
    assert spawn_calls.per_job(lo, hi, 20) == {"loop": {"f": 2.0, "k": 1.0}, "t": {}}


def test_a_small_pair_of_drains_counts_each_thread(tmp_path: Path) -> None:
    counts = [spawn_calls.drain(str(tmp_path / f"d{n}"), n) for n in (10, 30)]
    for d, n in zip(counts, (10, 30), strict=True):
        assert set(d) >= {"loop", "steadqd-prepare", "steadqd-settle"}, n
    per = spawn_calls.per_job(counts[0], counts[1], 20)
    verdicts = [v for k, v in per["loop"].items() if k.startswith("policy.py") and k.endswith("(verdict)")]
    assert verdicts == [1.0]
    applied = [v for k, v in per["steadqd-settle"].items() if k.endswith("(apply_verdict)")]
    assert applied == [1.0]
