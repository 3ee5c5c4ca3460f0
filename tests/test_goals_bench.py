"""benchmarks.goals judges issue 35's goals from the files its steps write; these tests feed it such files.

They check the judging and the table, not any speed: the figures are made up here and the
verdicts must follow them (a ratio just under a goal is "not met", a missing file "not measured").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import goals


def _bench(ratio_11: float, ratio_44: float) -> dict[str, Any]:
    def cfg(ratio: float) -> dict[str, Any]:
        runs = {
            "steadqd": [{"cpu_us_per_acked": 500}, {"cpu_us_per_acked": 700}, {"cpu_us_per_acked": None}],
            "reference": [{"cpu_us_per_acked": 300}, {"cpu_us_per_acked": 400}],
        }
        return {
            "runs": runs,
            "ratios": [ratio - 0.1, ratio, ratio + 0.05],
            "ratio_median": ratio,
            "steadqd_acked_per_s_median": 1000.0 * ratio,
            "reference_acked_per_s_median": 1000.0,
        }

    return {"bench": {"configs": {"1+1": cfg(ratio_11), "4+4": cfg(ratio_44)}}}


def _spawn(ratio: float, stranded: list[int]) -> dict[str, Any]:
    side = {"median_jobs_per_s": 500.0, "median_cpu_ms_per_job": 2.0, "stranded": stranded}
    floor = {"median_jobs_per_s": 500.0 / ratio, "median_cpu_ms_per_job": 0.7, "stranded": [0]}
    return {"steadqd": side, "floor": floor, "median_ratio": ratio, "median_ratio_steadqd-popen": ratio / 2}


def _write(out: Path, name: str, data: Any) -> None:
    path = out / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_each_goal_is_judged_from_its_file(tmp_path: Path) -> None:
    disk = _bench(1.02, 0.99)
    disk["headline"] = {"steadqd_strict_over": {"floor, Python": 0.95, "floor, C": 0.91}}
    _write(tmp_path, "disk/results.json", disk)
    _write(tmp_path, "ram/results.json", _bench(0.5, 1.0))
    _write(tmp_path, "spawn-disk.json", _spawn(0.81, [0, 0]))
    _write(tmp_path, "spawn-ram.json", _spawn(0.9, [0, 1]))  # fast enough, but a job was stranded
    _write(tmp_path, "bucket.json", [{"jobs_per_s": 80, "cpu_ms_per_job": 4.5, "ops_per_job": 11}] * 3)
    verdicts = {row["goal"]: row["met"] for row in goals.judge(tmp_path)}
    assert verdicts == {
        "steadq bench >= 1.0x the reference, 1+1, disk": True,
        "steadq bench >= 1.0x the reference, 4+4, disk": False,
        "steadq bench >= 1.0x the reference, 4+4, RAM": True,
        "steadq bench against the reference, 1+1, RAM": None,  # measured, not a goal
        "strict single-process lifecycle >= 0.9x the C floor": True,
        "worker spawner, true at 4, >= 0.8x its floor, none stranded, disk": True,
        "worker spawner, true at 4, >= 0.8x its floor, none stranded, RAM": False,
        "one steadqd.Worker on a bucket >= 72 jobs/s at <= 4 ms CPU a job": False,  # 4.5 ms a job
    }
    rows = goals.judge(tmp_path)
    assert rows[0]["measured"]["cpu_us_per_acked"] == {"steadqd": 600, "reference": 350}  # None runs left out
    table = goals.render(rows)
    assert "**1.02×** (1,020 vs 1,000 acked/s; rounds 0.92–1.07)" in table
    assert "**0.91×** the C floor, 0.95× the Python floor | met |" in table
    assert "1 stranded" in table


def test_missing_steps_are_not_measured_not_failed(tmp_path: Path) -> None:
    rows = goals.judge(tmp_path)
    assert [row["met"] for row in rows] == [None] * len(rows)
    assert goals.render(rows).count("not measured") == len(rows)


def test_bucket_rounds_keep_this_trees_json_lines_only() -> None:
    stdout = "\n".join(
        [
            json.dumps({"tree": "this", "jobs_per_s": 1}),
            json.dumps({"tree": "against", "jobs_per_s": 2}),
            json.dumps({"tree": "this", "error": "server went away"}),
            "this: median of 1: jobs_per_s 1",
        ]
    )
    assert goals._bucket_rounds(stdout) == [{"tree": "this", "jobs_per_s": 1}]


def test_report_only_writes_the_table_and_json(tmp_path: Path, capsys: Any) -> None:
    _write(tmp_path, "bucket.json", [{"jobs_per_s": 222, "cpu_ms_per_job": 2.71, "ops_per_job": 11.15}])
    assert goals.main(["--report-only", "--out", str(tmp_path)]) == 0
    assert "**222 jobs/s** at **2.71 ms** CPU a job, 11.2 store operations | met |" in capsys.readouterr().out
    assert (tmp_path / "goals.md").read_text().startswith("| goal | measured | |")
    assert json.loads((tmp_path / "goals.json").read_text())[-1]["met"] is True
