"""The recovery-backlog benchmark runs end to end on a tiny backlog; no speed is asserted.

It proves the scenario measures what it says: the expired lease does come
back (so a figure is produced, not a give-up), and the sweeper's leases are
each seen back in ``ready/``.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import recovery_backlog


def test_scenario_runs_and_every_lease_comes_back(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    args = ["--fs", "host", "--dir", str(tmp_path / "scratch"), "--receipts", "300", "--leases", "2"]
    args += ["--sweeper-interval", "0.2"]  # 300 receipts run out at once: the sweeper would idle 30 s
    assert recovery_backlog.main([*args, "--max-wait", "30", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["receipts"] == 300
    assert result["one_shot"]["runs_until_ready"] is not None
    assert len(result["sweeper"]["latencies_s"]) == 2 and None not in result["sweeper"]["latencies_s"]
