"""Issue 35's goals in one command: every goal measured fresh, side by side, and judged.

``python -m benchmarks.goals --reference PATH [--out DIR]`` (root: loop devices) runs, one after
the other so that none disturbs another:

1. ``benchmarks run --fs ext4 --sections headline,bench`` with the reference: the strict
   lifecycle against the floors and ``steadq bench`` against the reference's, on a loop ext4
   whose image is on the disk (``disk/``);
2. the same ``bench`` with the image held in RAM, where CPU decides (``ram/``);
3. ``benchmarks.daemons spawner --fallback`` on both images (``spawn-disk.json``, ``spawn-ram.json``);
4. ``benchmarks.bucket_api``: one ``steadqd.Worker`` on a same-host SeaweedFS (``bucket.json``).

Then it writes ``goals.json`` and ``goals.md`` (the table docs/performance.md quotes: each goal,
what was measured, met or not). ``--report-only`` judges the files already in ``--out`` again.
Why one module: the goals' run used to be five commands and a hand-made table; one command makes
the run repeatable, and the verdicts are computed, not typed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STEPS = ("disk", "ram", "spawn-disk", "spawn-ram", "bucket")


def _commands(reference: str, out: Path) -> dict[str, list[str]]:
    py = sys.executable
    run = [py, "-m", "benchmarks", "run", "--fs", "ext4", "--peers", "", "--reference", reference]
    return {
        "disk": [*run, "--sections", "headline,bench", "--out", str(out / "disk")],
        "ram": [*run, "--image-in-ram", "--sections", "bench", "--out", str(out / "ram")],
        "spawn-disk": [py, "-m", "benchmarks.daemons", "spawner", "--dir", "/var/tmp", "--fallback"],
        "spawn-ram": [py, "-m", "benchmarks.daemons", "spawner", "--dir", "/dev/shm", "--fallback"],
        "bucket": [py, "-m", "benchmarks.bucket_api", "--rounds", "4", "--jobs", "300"],
    }


def _bucket_rounds(stdout: str) -> list[dict[str, Any]]:
    """The per-round JSON lines bucket_api prints for this tree (its other lines are prose)."""
    rounds = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if row.get("tree") == "this" and "error" not in row:
                rounds.append(row)
    return rounds


def run_steps(reference: str, out: Path, steps: tuple[str, ...]) -> None:
    """Run the chosen steps in order; a step that fails stops the run (its stderr went to the terminal)."""
    out.mkdir(parents=True, exist_ok=True)
    commands = _commands(reference, out)
    for step in steps:
        print(f"goals: {step}: {' '.join(commands[step])}", file=sys.stderr, flush=True)
        started = time.time()
        done = subprocess.run(commands[step], stdout=subprocess.PIPE, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"goals: step {step} failed (exit {done.returncode}); see its output above")
        if step.startswith("spawn"):
            (out / f"{step}.json").write_text(done.stdout)
        elif step == "bucket":
            (out / "bucket.json").write_text(json.dumps(_bucket_rounds(done.stdout), indent=1) + "\n")
        print(f"goals: {step}: {time.time() - started:.0f} s", file=sys.stderr, flush=True)


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def _bench_row(results: Any, cfg: str) -> dict[str, Any] | None:
    if results is None or cfg not in results.get("bench", {}).get("configs", {}):
        return None
    e = results["bench"]["configs"][cfg]

    def cpu(side: str) -> float | None:
        vals = [x["cpu_us_per_acked"] for x in e["runs"].get(side, []) if x.get("cpu_us_per_acked") is not None]
        return statistics.median(vals) if vals else None

    ratios = e.get("ratios") or []
    return {
        "ratio": e.get("ratio_median"),
        "rounds": [min(ratios), max(ratios)] if ratios else None,
        "steadqd_acked_per_s": e["steadqd_acked_per_s_median"],
        "reference_acked_per_s": e.get("reference_acked_per_s_median"),
        "cpu_us_per_acked": {"steadqd": cpu("steadqd"), "reference": cpu("reference")},
    }


def judge(out: Path) -> list[dict[str, Any]]:
    """One row per goal: what was measured and whether it meets the goal (None: not measured)."""
    disk, ram = _load(out / "disk" / "results.json"), _load(out / "ram" / "results.json")
    rows: list[dict[str, Any]] = []
    for label, results, cfg, is_goal in (
        ("disk", disk, "1+1", True),
        ("disk", disk, "4+4", True),
        ("RAM", ram, "4+4", True),
        ("RAM", ram, "1+1", False),  # measured in the same run; the issue sets no goal for it
    ):
        row = _bench_row(results, cfg)
        judged = is_goal and row is not None and row["ratio"] is not None
        rows.append(
            {
                "goal": f"steadq bench {'>= 1.0x' if is_goal else 'against'} the reference, {cfg}, {label}",
                "measured": row,
                "met": row["ratio"] >= 1.0 if judged and row is not None else None,
            }
        )
    over = (disk or {}).get("headline", {}).get("steadqd_strict_over", {})
    strict = {"python_floor": over.get("floor, Python"), "c_floor": over.get("floor, C")} if over else None
    rows.append(
        {
            "goal": "strict single-process lifecycle >= 0.9x the C floor",
            "measured": strict,
            "met": None if not strict or strict["c_floor"] is None else strict["c_floor"] >= 0.9,
        }
    )
    for step, label in (("spawn-disk", "disk"), ("spawn-ram", "RAM")):
        sp = _load(out / f"{step}.json")
        measured = None
        if sp is not None:
            measured = {
                "ratio": sp.get("median_ratio"),
                "jobs_per_s": {s: sp[s]["median_jobs_per_s"] for s in ("steadqd", "floor") if s in sp},
                "cpu_ms_per_job": {s: sp[s]["median_cpu_ms_per_job"] for s in ("steadqd", "floor") if s in sp},
                "stranded": sum(sum(sp[s].get("stranded", [])) for s in ("steadqd",) if s in sp),
                "fallback_ratio": sp.get("median_ratio_steadqd-popen"),
            }
        rows.append(
            {
                "goal": f"worker spawner, true at 4, >= 0.8x its floor, none stranded, {label}",
                "measured": measured,
                "met": None if measured is None else measured["ratio"] >= 0.8 and measured["stranded"] == 0,
            }
        )
    bucket = _load(out / "bucket.json")
    measured = None
    if bucket:
        measured = {k: statistics.median(r[k] for r in bucket) for k in ("jobs_per_s", "cpu_ms_per_job", "ops_per_job")}
    rows.append(
        {
            "goal": "one steadqd.Worker on a bucket >= 72 jobs/s at <= 4 ms CPU a job",
            "measured": measured,
            "met": None if measured is None else measured["jobs_per_s"] >= 72 and measured["cpu_ms_per_job"] <= 4,
        }
    )
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    """The goals table in Markdown: the measured figures, not a summary of them."""
    lines = ["| goal | measured | |", "|---|---|---|"]
    for row in rows:
        m = row["measured"]
        if m is None:
            text = "not measured"
        elif "steadqd_acked_per_s" in m:
            cpu = m["cpu_us_per_acked"]
            text = (
                f"**{m['ratio']:.2f}×** ({m['steadqd_acked_per_s']:,.0f} vs {m['reference_acked_per_s']:,.0f} acked/s; "
                f"rounds {m['rounds'][0]:.2f}–{m['rounds'][1]:.2f}); CPU µs an acked job {cpu['steadqd']:.0f} / "
                f"{cpu['reference']:.0f}"
            )
        elif "c_floor" in m:
            text = f"**{m['c_floor']:.2f}×** the C floor, {m['python_floor']:.2f}× the Python floor"
        elif "fallback_ratio" in m:
            text = (
                f"**{m['ratio']:.2f}×** ({m['jobs_per_s'].get('steadqd', 0):,.0f} vs {m['jobs_per_s'].get('floor', 0):,.0f} "
                f"jobs/s; CPU {m['cpu_ms_per_job'].get('steadqd', 0):.2f} vs {m['cpu_ms_per_job'].get('floor', 0):.2f} "
                f"ms a job); {m['stranded']} stranded; the Popen fallback {m['fallback_ratio']:.2f}×"
            )
        else:
            text = f"**{m['jobs_per_s']:.0f} jobs/s** at **{m['cpu_ms_per_job']:.2f} ms** CPU a job, {m['ops_per_job']:.1f} store operations"
        verdict = {True: "met", False: "not met", None: "–"}[row["met"]]
        lines.append(f"| {row['goal']} | {text} | {verdict} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.goals", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--reference", help="the reference's built steadq binary (needed unless --report-only)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/goals-ext4"))
    ap.add_argument("--steps", default=",".join(STEPS), help=f"comma list of {','.join(STEPS)}")
    ap.add_argument("--report-only", action="store_true", help="judge the files already in --out")
    a = ap.parse_args(argv)
    if not a.report_only:
        steps = tuple(s for s in a.steps.split(",") if s)
        unknown = [s for s in steps if s not in STEPS]
        if unknown:
            ap.error(f"unknown step {unknown[0]!r}: choose from {', '.join(STEPS)}")
        if not a.reference or not os.access(a.reference, os.X_OK):
            ap.error(
                f"--reference must name the reference's built steadq (got {a.reference!r}); docs/performance.md says how to build it"
            )
        run_steps(a.reference, a.out, steps)
    rows = judge(a.out)
    (a.out / "goals.json").write_text(json.dumps(rows, indent=1) + "\n")
    table = render(rows)
    (a.out / "goals.md").write_text(table)
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
