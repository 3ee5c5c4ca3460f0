"""Issue 34 #3: the Grafana dashboard and Prometheus alert rules shipped in
/usr/share/steadqd/monitoring/ are valid, fire as documented, and use only metric names the
daemons write.

The names the daemons write are taken from a real :class:`Metrics` fed with sample data and
rendered (every family every role feeds), not from grepping the source: a renamed family
fails here. promtool comes from Debian's ``prometheus`` package (dev.sh installs it); without
it the promtool checks skip on a developer's machine and fail under STEADQ_SYSTEM_TESTS=require.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from steadqd.daemon.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent.parent
MONITORING = ROOT / "monitoring"
RULES = MONITORING / "steadqd-alerts.yml"
DASHBOARD = MONITORING / "steadqd-grafana.json"
RULES_TEST = Path(__file__).resolve().parent / "steadqd-alerts.test.yml"

_WORD = re.compile(r"(?<![\w.$])[a-zA-Z_:][a-zA-Z0-9_:]*")
_NOT_METRICS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "inf", "nan"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: words that are not functions, keywords,
    label names (in ``{…}`` or a ``by (…)`` list), strings, ranges or numbers."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = set()
    for m in _WORD.finditer(e):
        if e[m.end() :].lstrip().startswith("(") or m.group().lower() in _NOT_METRICS:
            continue
        names.add(m.group())
    return names


def emitted_names() -> set[str]:
    """Every sample name a daemon process that runs all three roles writes."""
    m = Metrics("render", "run")
    m.feed(("worker", "sweeper", "promoter"))
    m.job_finished("acked", 1.5)
    m.job_failed_to_start()
    m.recovered(promoted=1, reaped=1)
    m.counted({"ready": (3, 40.0), "delayed": (1, 2.0), "running": (1, 5.0), "dead": (0, 0.0)})
    m.swept(1796130000.0)
    return {line.split("{")[0].split(" ")[0] for line in m.render().splitlines() if not line.startswith("#")}


def rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    for v in doc["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((\w+),\s*\w+\)", v["query"]["query"])
            assert m, v["query"]
            exprs.append(m.group(1))
    return exprs


def test_the_extractor_finds_names_and_nothing_else() -> None:
    expr = 'sum by (queue, le) (rate(a_bucket{queue=~"$queue",x="by(b)"}[$__rate_interval])) / b offset 30m > 1e9'
    assert metric_names(expr) == {"a_bucket", "b"}
    assert metric_names("time() - c > 900") == {"c"}


def test_every_metric_the_dashboard_and_rules_use_is_one_the_daemons_write() -> None:
    emitted = emitted_names()
    assert {"steadqd_jobs_total", "steadqd_queue_jobs", "steadqd_job_duration_seconds_bucket"} <= emitted
    for source, exprs in (("rules", rule_exprs()), ("dashboard", dashboard_exprs())):
        assert exprs, source
        for expr in exprs:
            names = metric_names(expr)
            assert names, f"{source}: no metric in {expr!r}"
            assert names <= emitted, f"{source}: {sorted(names - emitted)} not written by the daemons ({expr!r})"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is missing: install Debian's prometheus package (./dev.sh setup does)")
    return path


def test_alert_rules_pass_promtool_check() -> None:
    p = subprocess.run([_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS: 5 rules found" in p.stdout


def test_alert_rules_fire_on_what_they_are_about() -> None:
    """promtool's rule unit tests: each alert fires on its series, after its ``for:``, and not before."""
    p = subprocess.run(
        [_promtool(), "test", "rules", str(RULES_TEST)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=RULES_TEST.parent,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULES_TEST.read_text()))
    assert tested == {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}


def test_the_package_and_the_bundle_ship_the_monitoring_files() -> None:
    """Without building them (tests/packaging/test_packaging.py builds them): each lists the directory."""
    install = (ROOT / "packaging" / "debian" / "steadqd.install").read_text().splitlines()
    assert "monitoring/steadqd-alerts.yml usr/share/steadqd/monitoring/" in install
    assert "monitoring/steadqd-grafana.json usr/share/steadqd/monitoring/" in install
    assert re.search(r"-cf - .* monitoring ", (ROOT / "packaging" / "build-deb.sh").read_text())  # the source tree
    assert 'cp "$SRC"/monitoring/* "$B/monitoring/"' in (ROOT / "packaging" / "build-bundle.sh").read_text()
    assert (
        'cp "$HERE"/monitoring/* "$D/share/steadq/monitoring/"'
        in (ROOT / "packaging" / "bundle" / "install.sh").read_text()
    )
