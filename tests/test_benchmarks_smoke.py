"""The benchmark harness runs end to end (tiny profile); no speed is asserted.

CI cannot afford the real benchmark and timings on shared runners mean
nothing, but a harness that silently rotted would only be noticed at release
time. This runs the documented command with ``--smoke`` and checks the
outputs are complete and that the correctness facts the harness reports
(no lost or duplicated jobs, every spawned job acknowledged, nothing stranded)
hold. Peers that are not installed are recorded as skipped, which is fine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def _errors(d: Any, prefix: str = "") -> list[str]:
    """Every measurement that recorded an error instead of a result."""
    out: list[str] = []
    if isinstance(d, dict):
        if isinstance(d.get("error"), str):
            out.append(f"{prefix}: {d['error']}")
        for k, v in d.items():
            out.extend(_errors(v, f"{prefix}.{k}"))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out.extend(_errors(v, f"{prefix}[{i}]"))
    return out


@pytest.fixture(scope="module")
def smoke_run() -> Iterator[tuple[dict[str, Any], Path]]:
    # Not tmp_path: the scratch dir must be a real disk (the harness refuses
    # tmpfs), and /var/tmp is one wherever /tmp might be tmpfs.
    work = Path(tempfile.mkdtemp(prefix="steadqd-bench-smoke-", dir="/var/tmp"))
    out = work / "out"
    try:
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = subprocess.run(
            [sys.executable, "-m", "benchmarks", "run", "--smoke", "--out", str(out), "--dir", str(work / "scratch")],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        results = json.loads((out / "results.json").read_text())
        yield results, out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_outputs_written(smoke_run: tuple[dict[str, Any], Path]) -> None:
    results, out = smoke_run
    md = (out / "results.md").read_text()
    for heading in (
        "## Targets",
        "## One process",
        "## Concurrency",
        "## Payload size sweep",
        "## Daemons",
        "## Scaling",
    ):
        assert heading in md
    assert (out / "profile.txt").read_text().strip()
    assert results["meta"]["profile"]["name"] == "smoke"
    assert not results["meta"]["machine"]["filesystem"].startswith("tmpfs")


def test_own_measurements_have_no_errors(smoke_run: tuple[dict[str, Any], Path]) -> None:
    """Peers may be skipped; the floor and every steadqd measurement must have run."""
    results, _ = smoke_run
    errors = _errors({k: results[k] for k in ("floor", "steadqd", "daemons", "scaling", "profile")})
    assert errors == []


def test_lifecycle_counts(smoke_run: tuple[dict[str, Any], Path]) -> None:
    results, _ = smoke_run
    for size in ("100", "4096", "1048576"):
        assert results["floor"]["python"][size]["lifecycle"]["jobs"] > 0
        assert results["steadqd"]["single"][size]["lifecycle"]["jobs"] > 0
    single = results["steadqd"]["single"]["100"]
    assert single["lease_ack_only"]["jobs"] == single["enqueue_only"]["jobs"]
    assert (
        results["steadqd"]["batched"]["lifecycle"]["jobs"]
        == results["meta"]["profile"]["batch_size"] * results["meta"]["profile"]["batches"]
    )


def test_multiprocess_loses_and_duplicates_nothing(smoke_run: tuple[dict[str, Any], Path]) -> None:
    results, _ = smoke_run
    mp = results["steadqd"]["mp"]["1+1"]
    assert mp["produced"] == results["meta"]["profile"]["mp_jobs"]
    assert (mp["lost"], mp["duplicates"]) == (0, 0)
    assert mp["acked"] == mp["produced"]


def test_daemon_measurements(smoke_run: tuple[dict[str, Any], Path]) -> None:
    results, _ = smoke_run
    d = results["daemons"]
    assert d["wake_latency"]["n"] == results["meta"]["profile"]["wake_jobs"]
    for sp in d["spawner"]:
        assert sp["acked"] == sp["jobs"]
        assert (sp["left_ready"], sp["left_leased"]) == (0, 0)
        assert sp["worker_exit"] == 0
    for role in ("worker", "sweeper", "promoter"):
        assert d["idle"][role]["rss_mb"] > 0


def test_scaling_and_syscalls(smoke_run: tuple[dict[str, Any], Path]) -> None:
    results, _ = smoke_run
    (point,) = results["scaling"]
    leases = results["meta"]["profile"]["scale_leases"]
    assert point["lease"]["n"] == point["lease_without_fsync"]["n"] == leases
    # Both passes acked what they leased: receipts, not ready, so stats counts the rest.
    assert point["stats_ready_objects"] == point["ready_jobs"] - 2 * leases
    assert point["stats_cli_ok"] is True
    sysc = results["steadqd"]["syscalls_per_job"]
    # One file fsync + the ready-dir fsync for enqueue, one for the claim, two for the ack.
    assert (sysc["enqueue"]["fsync"], sysc["lease"]["fsync"], sysc["ack"]["fsync"]) == (2, 1, 2)
