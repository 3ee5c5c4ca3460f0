"""Crash lab lane 2 for the deployed processes: power cuts under ``steadqd run`` on LazyFS.

Producers and ``steadqd run`` (spawner, sweeper, promoter) are real, separate,
uninstrumented processes; the crash states come from LazyFS's journal of what
the kernel did for them (:mod:`tests.lab.powercut`). Also: the lane can fail
(a lying fsync injected into every one of those processes through
``sitecustomize``), and the daemons refuse a FUSE queue unless the config says
``allow_unsupported_fs: true``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from steadqd import Queue
from steadqd.errors import ErrorKind
from tests.lab.killrig import STEADQD
from tests.lab.lab import format_report
from tests.lab.lanereport import emit
from tests.lab.lazyfs import mounted
from tests.lab.powercut import powercut_lane

pytestmark = pytest.mark.usefixtures("need_lazyfs")

SEED = int(os.environ.get("STEADQ_CRASH_SEED", "8"))

# Installed into every producer and daemon process of the rig via PYTHONPATH:
# fsync of a regular file returns success and does nothing.
LYING_FSYNC = """
import os, stat
_real = os.fsync
def _fsync(fd):
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        _real(fd)
os.fsync = _fsync
"""


def test_power_cut_under_steadqd_run(request: pytest.FixtureRequest) -> None:
    rep = powercut_lane(jobs=20, points=200, seed=SEED)
    emit(request, "lane 2 (power cut)", rep.line())
    assert rep.jobs == 40 and rep.marks == 40
    assert rep.result.states >= 100, "too few crash states to mean anything"
    assert rep.result.failed == 0, format_report(rep.result, syscalls="requests")


def test_power_cut_lane_catches_a_lying_fsync_in_the_daemons(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(LYING_FSYNC)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    rep = powercut_lane(jobs=6, points=80, seed=SEED)
    assert rep.result.failed > 0, "a lying fsync in every process went unnoticed"
    msgs = "\n".join(m for f in rep.result.failures for m in f["failures"])  # type: ignore[attr-defined]
    # Lost or corrupt data, however the oracle words it: a job quarantined, absent or not
    # verifying, a record (the watermark's fsync lied too) that does not authenticate, or a
    # control file the open refuses (the recovery cursor's fsync lied: empty after the cut).
    words = ("quarantined", "is absent", "does not verify", "does not authenticate", "QueueCorrupt")
    assert any(w in msgs for w in words), msgs


def test_daemons_refuse_a_fuse_queue_without_the_switch(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="steadq-lazyfs-") as mnt, mounted(mnt):
        root = os.path.join(mnt, "queue")
        Queue.init(root, shards=2, allow_unsupported_fs=True).close()
        conf = tmp_path / "conf"
        conf.mkdir()
        cfg = {"queue": root, "worker": {"command": ["/bin/true"]}}
        (conf / "fq.yaml").write_text(yaml.safe_dump(cfg))
        for role in ("worker", "sweeper", "promoter"):
            p = subprocess.run(
                [STEADQD, "--config-dir", str(conf), role, "fq"], capture_output=True, text=True, timeout=60
            )
            assert p.returncode == ErrorKind.UNSUPPORTED_FILESYSTEM.exit_code, (role, p.returncode, p.stderr)
            assert "fuse" in p.stderr.lower(), p.stderr
